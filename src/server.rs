//! The telegram listeners: accept loop, one task per connection, pipelined
//! telegrams answered in order, channel-side timeouts, and draining.
//!
//! A plain and a TLS listener may run side by side; they share the connection
//! limit and the drain. A TLS connection first completes its handshake within
//! the handshake timeout, then is served by the same code as a plain one,
//! which is generic over the stream ([`ChannelStream`]).
//!
//! A connection's task reads (framing, timeouts). While the channel has one
//! telegram at a time in flight, that task also handles it and writes its
//! answer, still reading meanwhile: no hand-off between tasks on the way. Once
//! a second telegram arrives before the first is answered (pipelining), the
//! connection gets a writer task for good: each telegram is handled in a task
//! of its own whose handle is queued to the writer, which writes the answers in
//! the order the telegrams came; the queue's size is the per-connection
//! in-flight limit. A telegram whose handling panics is answered E901 either way.
//!
//! A plain TCP connection busy with one telegram at a time is lent to a thread
//! of its own, which handles, calls the core, answers and reads in place, until
//! the connection idles, pipelines or meets a slow core (`adoption.rs`).
//!
//! `accept.rs` takes connections in: the listeners, the accept loop, a
//! connection's task and TLS handshake, and the drain; this file serves a
//! connection once it is in.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{Instrument, debug, info, warn};

mod accept;
mod adoption;
mod waiting;

pub use accept::{TlsListener, bind, listen, reserve, run};
use adoption::{Adopters, Back, Carry};
use waiting::{Held, HeldTelegrams, StartedLate, WaitingMark};

use crate::catch_unwind::{CatchUnwind, Panic, panic_message};
use crate::config::ServerConfig;
use crate::frame::{FrameCodec, PrefixMode};
use crate::header::{Echo, local_timestamp, write_response};
use crate::outcome::Code;
use crate::relay::{Hub, Reply};
use crate::rules::ClientCert;

/// Channel-side limits, from `[server]`.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub prefix: PrefixMode,
    pub max_telegram_len: usize,
    pub idle_timeout: Duration,
    pub read_timeout: Duration,
    pub max_connections: usize,
    pub max_in_flight_per_connection: usize,
    pub write_timeout: Duration,
    pub tls_handshake_timeout: Duration,
    /// The budget: an answer written later is counted (see [`answered`]).
    pub budget: Duration,
}

impl From<&ServerConfig> for Limits {
    fn from(s: &ServerConfig) -> Self {
        Limits {
            prefix: s.prefix,
            max_telegram_len: s.max_telegram_len,
            idle_timeout: Duration::from_millis(s.idle_timeout_ms),
            read_timeout: Duration::from_millis(s.read_timeout_ms),
            max_connections: s.max_connections,
            max_in_flight_per_connection: s.max_in_flight_per_connection,
            write_timeout: Duration::from_millis(s.write_timeout_ms),
            tls_handshake_timeout: Duration::from_millis(s.tls_handshake_timeout_ms),
            budget: Duration::from_millis(s.budget_ms),
        }
    }
}

/// What a connection asks of the hub: the answer to one telegram. A seam of
/// the server's own, so its handling of a telegram task that fails can be
/// tested with a task that does.
trait Answerer: Send + Sync + 'static {
    /// Owns the hub (`Arc`), so that the future is boxed as it is, with no
    /// block around it to hold the arguments twice (see [`handling`]). It
    /// must do nothing that can panic before it is polled: [`handling`]
    /// calls it outside the guard that turns a panic into an E901. It is
    /// called as the telegram starts, in its connection's order (the hub
    /// looks at its drain then).
    /// `deferred`: the future may not be polled at once (it is spawned, or
    /// held by the connection's task), so telegrams started after it may
    /// be handled before it first runs.
    fn answer(
        self: Arc<Self>,
        telegram: Bytes,
        peer: IpAddr,
        cert: Option<Arc<ClientCert>>,
        read_at: Instant,
        deferred: bool,
    ) -> impl Future<Output = (Echo, Reply)> + Send;

    /// A telegram, read whole, waits for room to start: whether its GUID
    /// now counts as handled (the hub counts every one: a reload may make
    /// any tx code a transfer's before it starts).
    fn waiting_to_start(&self, _echo: &Echo) -> bool {
        false
    }

    /// A telegram that waited starts now: whether its count ends here
    /// rather than with its task (an inquiry's: one whose own GUID is the
    /// one it asks about must not find itself handled).
    fn counts_until_start(&self, _echo: &Echo) -> bool {
        false
    }

    /// A telegram `waiting_to_start` counted has ended.
    fn no_longer_waiting(&self, _guid: &str) {}

    /// The latest a telegram read whole at `read_at` can start to be worked
    /// on: one still waiting for room then is answered without room
    /// (nothing is sent for it, so its answer is quick), instead of one at
    /// a time as its connection's telegrams ahead of it answer.
    fn last_start(&self, _read_at: Instant) -> Option<Instant> {
        None
    }
}

impl Answerer for Hub {
    // A block, not an `async fn`: an `async fn` moves its arguments into
    // locals and keeps both (the telegram and the certificate twice).
    #[allow(clippy::manual_async_fn)]
    fn answer(
        self: Arc<Self>,
        telegram: Bytes,
        peer: IpAddr,
        cert: Option<Arc<ClientCert>>,
        read_at: Instant,
        deferred: bool,
    ) -> impl Future<Output = (Echo, Reply)> + Send {
        // Now, as the telegram starts in its connection's order, not when
        // its task first runs (see `Hub::handle_started`): the drain and
        // the rules; and a transfer
        // that will run later counts as being posted until it does.
        let start = self.at_start();
        let mut may_post = (deferred && !start.draining)
            .then(|| self.may_post(&start, &telegram))
            .flatten();
        async move {
            let answer = self
                .handle_started(
                    &telegram,
                    peer,
                    cert.as_deref(),
                    read_at,
                    &start,
                    &mut may_post,
                )
                .await;
            drop(may_post);
            answer
        }
    }

    fn waiting_to_start(&self, echo: &Echo) -> bool {
        Hub::waiting_to_start(self, echo.tx_code_str(), echo.guid_str())
    }

    fn counts_until_start(&self, echo: &Echo) -> bool {
        Hub::is_inquiry(self, echo.tx_code_str())
    }

    fn no_longer_waiting(&self, guid: &str) {
        Hub::no_longer_waiting(self, guid);
    }

    fn last_start(&self, read_at: Instant) -> Option<Instant> {
        Some(Hub::last_start(self, read_at))
    }
}

/// A connection's byte stream, split into a reader and a writer that run in
/// tasks of their own: a plain TCP stream splits into its owned halves (no
/// lock between them), a TLS stream through tokio's split.
pub trait ChannelStream: Send + 'static {
    type Reader: AsyncRead + Unpin + Send + 'static;
    type Writer: AsyncWrite + Unpin + Send + 'static;
    fn split(self) -> (Self::Reader, Self::Writer);
    /// Whether a connection of this kind can be lent to an adopter
    /// (`adoption.rs`): plain TCP only.
    const LENDABLE: bool = false;
    /// Whether bytes from the channel wait in the socket, not yet read (a
    /// look that does not wait); false where the stream cannot tell.
    fn bytes_waiting(_reader: &Self::Reader) -> bool {
        false
    }
    /// The halves joined again as a socket, to lend to an adopter; called
    /// only when [`ChannelStream::LENDABLE`].
    fn into_std(
        _reader: Self::Reader,
        _writer: Self::Writer,
    ) -> std::io::Result<std::net::TcpStream> {
        Err(std::io::Error::other(
            "only a plain TCP connection can be lent",
        ))
    }
}

impl ChannelStream for TcpStream {
    type Reader = tokio::net::tcp::OwnedReadHalf;
    type Writer = tokio::net::tcp::OwnedWriteHalf;
    fn split(self) -> (Self::Reader, Self::Writer) {
        self.into_split()
    }
    const LENDABLE: bool = true;
    fn bytes_waiting(reader: &Self::Reader) -> bool {
        let stream: &TcpStream = reader.as_ref();
        crate::peek::peek_fd_now(stream) == crate::peek::Peeked::Bytes
    }
    fn into_std(
        reader: Self::Reader,
        writer: Self::Writer,
    ) -> std::io::Result<std::net::TcpStream> {
        reader
            .reunite(writer)
            .map_err(std::io::Error::other)?
            .into_std()
    }
}

type TlsStream = tokio_rustls::server::TlsStream<TcpStream>;

impl ChannelStream for TlsStream {
    type Reader = tokio::io::ReadHalf<TlsStream>;
    type Writer = tokio::io::WriteHalf<TlsStream>;
    fn split(self) -> (Self::Reader, Self::Writer) {
        tokio::io::split(self)
    }
}

/// `t + d`, saturating: a timeout configured in the millions of years must not
/// panic a connection's task (an `Instant` overflows long before a `u64` of ms).
fn later(t: Instant, d: Duration) -> Instant {
    const FAR: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);
    t.checked_add(d).or_else(|| t.checked_add(FAR)).unwrap_or(t)
}

/// How long a draining hub lets connections finish once its telegrams in
/// flight are answered: a telegram whose last bytes arrive then still gets
/// its E903 (a connection that holds nothing closes at once; one still
/// holding part of a telegram after this is closed without an answer).
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// Telegrams read whole and not yet answered, across all connections; and
/// the drain's signal to close the connections that hold nothing.
#[derive(Default)]
struct InFlight {
    count: AtomicUsize,
    idle: Notify,
    closing: AtomicBool,
    close: Notify,
}

impl InFlight {
    /// Tells every connection to close once it holds nothing (no telegram,
    /// whole or in part, and no answer to write).
    fn close_idle(&self) {
        self.closing.store(true, Ordering::SeqCst);
        self.close.notify_waiters();
    }

    fn is_closing(&self) -> bool {
        self.closing.load(Ordering::SeqCst)
    }

    /// Resolves once [`InFlight::close_idle`] was called.
    async fn closing(&self) {
        loop {
            let notified = self.close.notified();
            if self.is_closing() {
                return;
            }
            notified.await;
        }
    }

    fn enter(self: &Arc<Self>) -> InFlightGuard {
        self.count.fetch_add(1, Ordering::SeqCst);
        InFlightGuard(self.clone())
    }

    async fn wait_idle(&self) {
        loop {
            let notified = self.idle.notified();
            if self.count.load(Ordering::SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }
}

struct InFlightGuard(Arc<InFlight>);

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// What a connection's reader and writer share.
#[derive(Default)]
struct Link {
    /// Telegrams read and not yet answered on this connection.
    pending: AtomicUsize,
    /// Woken after each answer is written: idle time counts from there.
    answered: Notify,
    /// Woken when the writer stops (closing answer, or the channel went away).
    stop: Notify,
    /// Set by the writer at a closing answer (E903 while the hub drains):
    /// the reader reads nothing more, queues the telegrams it holds whole
    /// (each was read, so each is answered before the close), and ends.
    closing: AtomicBool,
}

/// A telegram's handling: the hub's answer, or the panic that ended it. It
/// runs on its connection's task while the channel sends one telegram at a
/// time, and is moved into a task of its own once the channel pipelines.
///
/// Its box is one allocation per telegram: kept within the 1,032 bytes
/// glibc's per-thread cache serves (docs/performance.md, "A telegram's
/// future under 1 KiB"), which a block around the hub's future, holding
/// the arguments again, had pushed to 1,072.
type Handling = CatchUnwind<Pin<Box<dyn Future<Output = (Echo, Reply)> + Send>>>;

fn handling<H: Answerer>(
    hub: Arc<H>,
    telegram: Bytes,
    peer: IpAddr,
    cert: Option<Arc<ClientCert>>,
    read_at: Instant,
    deferred: bool,
) -> Handling {
    CatchUnwind(Box::pin(
        hub.answer(telegram, peer, cert, read_at, deferred),
    ))
}

/// What the writer sends next.
enum Answer {
    /// A telegram being handled; answered when its task ends. The echo is
    /// taken before the task starts, for an answer should the task fail.
    /// The permit is one of the connection's `max_in_flight_per_connection`,
    /// held until the answer is written: the writer takes a telegram out of
    /// the queue to wait for it, so the queue's own capacity would let one
    /// more start. None for a telegram whose budget ran out while it waited
    /// for room: it starts without one (see [`Answerer::last_start`]).
    Telegram(
        JoinHandle<Result<(Echo, Reply), Panic>>,
        Echo,
        InFlightGuard,
        Option<OwnedSemaphorePermit>,
        Instant,
    ),
    /// A framing error: E102 with a blank header, then close.
    Unframeable,
}

/// A telegram handled on the connection's own task, and what its answer needs.
struct Inline {
    handling: Handling,
    echo: Echo,
    guard: InFlightGuard,
    read_at: Instant,
}

/// The writing half of a connection and its buffers: answers are framed and
/// written one at a time, each within the write timeout.
struct AnswerWriter<W> {
    writer: W,
    framer: Framer,
    write_timeout: Duration,
    budget: Duration,
}

impl<W: AsyncWrite + Unpin> AnswerWriter<W> {
    fn new(writer: W, codec: FrameCodec, limits: &Limits) -> Self {
        AnswerWriter {
            writer,
            framer: Framer::new(codec),
            write_timeout: limits.write_timeout,
            budget: limits.budget,
        }
    }

    /// Writes one answer. `false`: the connection cannot go on (the answer
    /// cannot be framed, the channel is gone, or it does not read).
    async fn write(&mut self, echo: &Echo, code: &str, body: &[u8]) -> bool {
        let Some(framed) = self.framer.frame(echo, code, body) else {
            return false;
        };
        // A channel that does not read its answers must not keep its slot, nor
        // hold a drain up, for ever.
        let written = tokio::time::timeout(self.write_timeout, self.writer.write_all(framed)).await;
        match written {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                debug!(%e, "write failed; channel gone");
                false
            }
            Err(_) => {
                write_timed_out(self.write_timeout);
                false
            }
        }
    }

    /// Closes the writing side, within the write timeout: a TLS stream
    /// flushes its close there, and a channel that stopped reading must
    /// not hold its connection (or a drain) for ever.
    async fn shutdown(&mut self) {
        let _ = tokio::time::timeout(self.write_timeout, self.writer.shutdown()).await;
    }

    /// Writes the answer to a telegram read whole at `read_at` whose
    /// handling ended, and says what the connection does next.
    async fn answer(
        &mut self,
        echo: Echo,
        done: Result<(Echo, Reply), String>,
        link: &Link,
        read_at: Instant,
    ) -> Then {
        let (echo, reply) = match done {
            Ok(answer) => answer,
            Err(why) => failed_task(echo, &why),
        };
        let written = self.write(&echo, reply.code.as_str(), &reply.body).await;
        if written {
            answered(read_at, self.budget);
        }
        link.pending.fetch_sub(1, Ordering::SeqCst);
        match (written, reply.close) {
            (false, _) => Then::Gone,
            (true, true) => Then::Close,
            (true, false) => Then::GoOn,
        }
    }
}

/// What a connection does after an answer.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Then {
    GoOn,
    /// A closing answer (E903 while the hub drains): no telegram is read
    /// after it; the ones already read get their answers, then it closes.
    Close,
    /// The write failed: the channel is gone.
    Gone,
}

/// Frames answers, reusing its buffers from one answer to the next.
struct Framer {
    codec: FrameCodec,
    telegram: Vec<u8>,
    framed: BytesMut,
}

impl Framer {
    fn new(codec: FrameCodec) -> Framer {
        Framer {
            codec,
            telegram: Vec::with_capacity(128),
            framed: BytesMut::with_capacity(160),
        }
    }

    /// One answer, framed; `None` (logged) when it cannot be framed.
    fn frame(&mut self, echo: &Echo, code: &str, body: &[u8]) -> Option<&[u8]> {
        self.telegram.clear();
        self.framed.clear();
        write_response(echo, &local_timestamp(), code, body, &mut self.telegram);
        if let Err(e) = self.codec.encode(&self.telegram, &mut self.framed) {
            tracing::error!(%e, "answer cannot be framed");
            return None;
        }
        Some(&self.framed)
    }
}

/// An answer to a telegram read whole at `read_at` is written: counted when
/// that is past its budget, and said at WARN (at once, then at most every
/// 10 s with the count). The summary line's `ms` and the latency histogram
/// end when the answer is ready; a pipelined answer then waits for the ones
/// ahead of it, and any answer for the channel to take it: this sees both.
fn answered(read_at: Instant, budget: Duration) {
    let took = read_at.elapsed();
    if took <= budget {
        return;
    }
    metrics::counter!(crate::metric_names::ANSWERS_PAST_BUDGET).increment(1);
    /// The throttle, and the latest an answer came since its last line.
    static PAST: std::sync::Mutex<(crate::throttle::Throttle, Duration)> = std::sync::Mutex::new((
        crate::throttle::Throttle::new(Duration::from_secs(10)),
        Duration::ZERO,
    ));
    let mut past = PAST.lock().unwrap_or_else(|p| p.into_inner());
    let (throttle, latest) = &mut *past;
    *latest = (*latest).max(took - budget);
    let due = throttle.note(Instant::now());
    if let Some(answers) = due {
        let max_past_ms = std::mem::take(latest).as_millis() as u64;
        drop(past);
        warn!(
            answers,
            max_past_ms,
            budget_ms = budget.as_millis() as u64,
            "answers written past their budget (counted in relayhub_answers_past_budget_total): \
             the hub is short of CPU, or channels read their answers slowly or pipeline deeper \
             than it can answer in time"
        );
    }
}

/// Counts and logs an answer the channel did not take within the write
/// timeout (the connection closes).
fn write_timed_out(write_timeout: Duration) {
    metrics::counter!(crate::metric_names::ANSWER_WRITE_TIMEOUTS).increment(1);
    warn!(
        write_timeout_ms = write_timeout.as_millis() as u64,
        "answer not written within the write timeout (the channel does not read); closing the connection"
    );
}

/// The writer task, started when a connection first has a second telegram
/// in flight (or a framing error to answer behind one); from then on the
/// connection's answers go through its queue, in the order the telegrams came.
struct Queue {
    tx: mpsc::Sender<Answer>,
    task: JoinHandle<()>,
    /// One per telegram of the connection in flight, up to its limit.
    permits: Arc<Semaphore>,
}

/// The queue to the writer task, started (with the writing half) on first
/// use; a telegram handled inline until now goes first. `None`: the writer
/// has stopped.
async fn queue_up<'q, W: AsyncWrite + Unpin + Send + 'static>(
    direct: &mut Option<AnswerWriter<W>>,
    queue: &'q mut Option<Queue>,
    inline: &mut Option<Inline>,
    capacity: usize,
    link: &Arc<Link>,
) -> Option<&'q Queue> {
    if let Some(writer) = direct.take() {
        // Twice the permits: as many again for telegrams started past
        // their last start, which go in without a permit (those beyond
        // wait in the reader, in `StartedLate`).
        let (tx, rx) = mpsc::channel(capacity.saturating_mul(2));
        let task = tokio::spawn(write_answers(writer, rx, link.clone()).in_current_span());
        let permits = Arc::new(Semaphore::new(capacity));
        let queue = queue.insert(Queue { tx, task, permits });
        if let Some(Inline {
            handling,
            echo,
            guard,
            read_at,
        }) = inline.take()
        {
            // A fresh queue has room and a permit (the limit is at least
            // one); a writer that already stopped is seen by the caller's
            // next send.
            let permit = queue
                .permits
                .clone()
                .try_acquire_owned()
                .expect("a fresh queue has every permit, and the limit is at least one");
            let task = tokio::spawn(handling.in_current_span());
            let _ = queue
                .tx
                .send(Answer::Telegram(task, echo, guard, Some(permit), read_at))
                .await;
        }
    }
    queue.as_ref()
}

impl Queue {
    /// Room for one more telegram of the connection: a permit (waits while
    /// `max_in_flight_per_connection` are in flight), then a slot in the
    /// queue. `None` once the writer has stopped.
    async fn room(&self) -> Option<(mpsc::Permit<'_, Answer>, OwnedSemaphorePermit)> {
        let permit = self.permits.clone().acquire_owned().await.ok()?;
        let slot = self.tx.reserve().await.ok()?;
        Some((slot, permit))
    }
}

/// A slot in the writer's queue; `None` once the writer has stopped.
async fn queue_slot(queue: &Option<Queue>) -> Option<mpsc::Permit<'_, Answer>> {
    queue.as_ref()?.tx.reserve().await.ok()
}

/// How a telegram that waited for room goes on.
enum Turn<'q> {
    /// With room: a slot in the writer's queue and a permit.
    Room(mpsc::Permit<'q, Answer>, OwnedSemaphorePermit),
    /// Without: its time to start has passed (see [`StartedLate`]).
    Late,
}

/// How a connection's task ended.
enum Served {
    /// The connection is closed.
    Ended,
    /// Lent to an adopter with the telegram just read (plain TCP only).
    Lend(std::net::TcpStream, Bytes, Instant, InFlightGuard),
}

/// A plain TCP connection: served here, and lent to an adopter thread while
/// it is busy with one telegram at a time and the core answers quickly
/// (`adoption.rs`); this task owns it throughout and resumes it when it comes
/// back.
async fn serve_plain<H: Answerer>(
    mut stream: TcpStream,
    peer: SocketAddr,
    hub: Arc<H>,
    limits: Limits,
    in_flight: Arc<InFlight>,
    adopters: Option<Arc<Adopters>>,
    mut carry: Carry,
) {
    let start: adoption::Start = {
        let hub = hub.clone();
        Arc::new(move |telegram, read_at, deferred| {
            handling(hub.clone(), telegram, peer.ip(), None, read_at, deferred)
        })
    };
    loop {
        let served = serve_connection(
            stream,
            peer,
            None,
            hub.clone(),
            limits,
            in_flight.clone(),
            carry,
            adopters.as_deref(),
        )
        .await;
        let (Served::Lend(lent, telegram, read_at, guard), Some(adopters)) = (served, &adopters)
        else {
            return;
        };
        let back = adopters.lend(adoption::Lent {
            stream: lent,
            telegram,
            read_at,
            guard,
            start: start.clone(),
            in_flight: in_flight.clone(),
            limits,
            span: tracing::Span::current(),
        });
        let Ok(Back::Resume(lent, resumed)) = back.await else {
            return;
        };
        // A telegram still being handled is answered whatever happens to
        // the socket's registration: through a second descriptor, since a
        // failed registration closes the one it was given.
        let spare = resumed.inline.as_ref().and_then(|_| lent.try_clone().ok());
        match adopters.resume(lent) {
            Ok(s) => (stream, carry) = (s, resumed),
            Err(e) => {
                match (resumed.inline, spare) {
                    (Some(flight), Some(spare)) => {
                        debug!(%e, "a connection could not return to the reactor; its telegram in flight is answered, then it is closed");
                        adoption::answer_then_close(spare, flight, limits).await;
                    }
                    _ => debug!(%e, "a connection could not return to the reactor; closed"),
                }
                return;
            }
        }
    }
}

/// Serves a connection until it closes, or (plain TCP with `adopters`)
/// until it is lent. `carry` is where an earlier part of its service left it.
#[allow(clippy::too_many_arguments)]
async fn serve_connection<S: ChannelStream, H: Answerer>(
    stream: S,
    peer: SocketAddr,
    cert: Option<Arc<ClientCert>>,
    hub: Arc<H>,
    limits: Limits,
    in_flight: Arc<InFlight>,
    carry: Carry,
    adopters: Option<&Adopters>,
) -> Served {
    let (mut reader, writer) = stream.split();
    let link = Arc::new(Link::default());
    let codec = FrameCodec::new(limits.prefix, limits.max_telegram_len);
    let capacity = limits.max_in_flight_per_connection;
    // While the channel sends one telegram at a time, this task handles it
    // and writes its answer (still reading, to see a next telegram or the
    // channel going away); a second telegram in flight moves the connection
    // to a writer task and a task per telegram, for good.
    let mut direct = Some(AnswerWriter::new(writer, codec, &limits));
    let mut queue: Option<Queue> = None;
    let Carry {
        mut buf,
        mut started,
        mut idle_from,
        mut inline,
        mut from_backlog,
        mut framed,
    } = carry;
    buf.reserve(512);
    // The last telegram outlasted an adopter's patience: not lent again
    // until one is quick.
    let mut slow = inline.is_some();
    // Telegrams framed while their connection waits for room (see `HeldTelegrams`).
    let mut held: HeldTelegrams<H> = HeldTelegrams::default();
    // Answers of telegrams started past their last start, waiting for a
    // slot in the writer's queue (see `StartedLate`).
    let mut started_late: StartedLate<Answer> = StartedLate::default();
    if inline.is_some() {
        link.pending.fetch_add(1, Ordering::SeqCst);
    }
    'read: loop {
        // Every complete telegram in the buffer: handled here when it is the
        // only one in flight, otherwise in a task of its own.
        loop {
            let next = match held.pop() {
                Some(h) => Ok(Some(h)),
                None => codec.decode(&mut buf).map(|t| {
                    t.map(|telegram| Held {
                        telegram,
                        read_at: Instant::now(),
                        mark: None,
                    })
                }),
            };
            match next {
                Ok(Some(Held {
                    telegram,
                    read_at,
                    mark,
                })) => {
                    started = None;
                    framed = true;
                    let guard = in_flight.enter();
                    let alone =
                        direct.is_some() && inline.is_none() && buf.is_empty() && held.is_empty();
                    if alone && S::LENDABLE && !slow && adopters.is_some_and(Adopters::has_room) {
                        let writer = direct.take().expect("checked above").writer;
                        return match S::into_std(reader, writer) {
                            Ok(lent) => Served::Lend(lent, telegram, read_at, guard),
                            Err(e) => {
                                debug!(%e, "a connection could not leave the reactor; closed");
                                Served::Ended
                            }
                        };
                    }
                    link.pending.fetch_add(1, Ordering::SeqCst);
                    let echo = Echo::from_telegram(&telegram);
                    let len = telegram.len();
                    // A telegram's handling is made as it starts, in the
                    // connection's order: the hub takes it as started before
                    // a drain or not then, and the telegrams behind it too
                    // when it was (before, it was made at its read and
                    // looked at the drain when its task first ran: a
                    // transfer could get the drain's E903 while the one
                    // pipelined behind it was posted; a black-box probe).
                    if alone {
                        inline = Some(Inline {
                            handling: handling(
                                hub.clone(),
                                telegram,
                                peer.ip(),
                                cert.clone(),
                                read_at,
                                true,
                            ),
                            echo,
                            guard,
                            read_at,
                        });
                        break;
                    }
                    let Some(queue) =
                        queue_up(&mut direct, &mut queue, &mut inline, capacity, &link).await
                    else {
                        break 'read;
                    };
                    // Room first, the task after: a writer that stopped
                    // meanwhile (a closing answer) leaves this telegram
                    // unhandled, not handled, logged and never answered.
                    // Only this task takes permits: one free now is free
                    // at the `room` below.
                    // Full too when the queue has no slot left (telegrams
                    // past their last start went in without a permit: a
                    // free permit alone would wait for a slot uncounted,
                    // with the connection no longer read; found by a
                    // review), or while answers started late wait for a
                    // slot: this one goes behind them.
                    if !started_late.queue_ready(&queue.tx) {
                        break 'read;
                    }
                    let full = !started_late.is_empty()
                        || queue.permits.available_permits() == 0
                        || queue.tx.capacity() == 0;
                    let waits = mark.or_else(|| full.then(|| WaitingMark::new(&hub, &echo)));
                    // While it waits, the telegrams read whole behind it
                    // wait too: each counted as handled, and timed, from its
                    // read, not from when room frees up for it. And the
                    // connection is read on meanwhile, up to a connection's
                    // worth of telegrams more, so that a transfer the
                    // channel sent is known to the hub (an inquiry about it
                    // is not told "never received") instead of waiting
                    // unread in the socket (found by a review). Once its
                    // time to start has passed it waits no more: it starts
                    // then, without room, nothing being sent for it, and is
                    // answered right behind the answers ahead of it (before,
                    // one at a time as each of those freed its room: with
                    // thousands of budgets ending together, answers came
                    // past the budget; a black-box probe). Meanwhile the
                    // answers started late before it go into the writer's
                    // queue as it frees slots.
                    let turn = if full {
                        let room = queue.room();
                        tokio::pin!(room);
                        let read_ahead = limits.max_telegram_len.saturating_mul(capacity);
                        let mut reads = true;
                        let last_start = hub.last_start(read_at);
                        let ran_out = tokio::time::sleep_until(
                            last_start.unwrap_or_else(|| later(Instant::now(), Duration::MAX)),
                        );
                        tokio::pin!(ran_out);
                        loop {
                            held.hold_whole(&codec, &mut buf, &hub);
                            tokio::select! {
                                biased;
                                slot = queue.tx.reserve(), if !started_late.is_empty() => match slot {
                                    Ok(slot) => started_late.queue_first(slot),
                                    Err(_) => break None,
                                },
                                got = &mut room, if started_late.is_empty() => {
                                    break got.map(|(slot, permit)| Turn::Room(slot, permit));
                                }
                                _ = &mut ran_out, if last_start.is_some() => break Some(Turn::Late),
                                read = reader.read_buf(&mut buf), if reads
                                    && buf.len() + held.bytes + started_late.bytes < read_ahead
                                    && !link.closing.load(Ordering::SeqCst) => {
                                    // The end or a failure is met again by
                                    // the read after these telegrams.
                                    reads = matches!(read, Ok(n) if n > 0);
                                }
                            }
                        }
                    } else {
                        queue
                            .room()
                            .await
                            .map(|(slot, permit)| Turn::Room(slot, permit))
                    };
                    let Some(turn) = turn else {
                        break 'read;
                    };
                    let handling = handling(
                        hub.clone(),
                        telegram,
                        peer.ip(),
                        cert.clone(),
                        read_at,
                        true,
                    );
                    let task = match waits {
                        Some(mark) => mark.spawn_with(handling, &echo),
                        None => tokio::spawn(handling.in_current_span()),
                    };
                    match turn {
                        Turn::Room(slot, permit) => {
                            slot.send(Answer::Telegram(task, echo, guard, Some(permit), read_at))
                        }
                        Turn::Late => {
                            started_late
                                .push(len, Answer::Telegram(task, echo, guard, None, read_at));
                            if !started_late.queue_ready(&queue.tx) {
                                break 'read;
                            }
                        }
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    // What the bytes seem to be, when they say.
                    let seems = match crate::frame::tls_record(&buf) {
                        Some(record) => format!(
                            " (the bytes begin {record}: the channel speaks TLS, and this \
                             listener is plain; TLS channels connect to tls_listen)"
                        ),
                        // A telegram framed before says the prefix mode
                        // is right: most likely an earlier length was wrong
                        // and these bytes are the rest of that telegram
                        // (before, they were blamed on the other mode's
                        // prefix; found by a black-box probe).
                        None if framed => " (a telegram was framed on this connection before, so \
                            its prefix mode is right: most likely an earlier telegram's length \
                            prefix was wrong, and these bytes are what was left of it)"
                            .to_string(),
                        None => crate::frame::other_prefix(limits.prefix, &buf)
                            .map(|(what, other)| {
                                format!(
                                    " ({what}: the channel seems to send the {} prefix, and \
                                     this listener takes the {} one)",
                                    other.name(),
                                    limits.prefix.name()
                                )
                            })
                            .unwrap_or_default(),
                    };
                    warn!(error = %e, "unframeable input; answering E102 and closing{seems}");
                    if let Some(queue) =
                        queue_up(&mut direct, &mut queue, &mut inline, capacity, &link).await
                    {
                        // Behind the answers started late, in its order.
                        if started_late.queue_all(&queue.tx).await {
                            let _ = queue.tx.send(Answer::Unframeable).await;
                        }
                    }
                    break 'read;
                }
            }
        }
        // After a closing answer every telegram held whole is queued now.
        if link.closing.load(Ordering::SeqCst) {
            break 'read;
        }
        if !buf.is_empty() && started.is_none() {
            started = Some(Instant::now());
        }
        let deadline = match started {
            Some(t) => later(t, limits.read_timeout),
            None => later(
                idle_from.take().unwrap_or_else(Instant::now),
                limits.idle_timeout,
            ),
        };
        let queued = queue.is_some();
        let holds_nothing =
            buf.is_empty() && inline.is_none() && link.pending.load(Ordering::SeqCst) == 0;
        tokio::select! {
            done = async {
                match inline.as_mut() {
                    Some(i) => Some((&mut i.handling).await),
                    None => None,
                }
            }, if inline.is_some() => {
                if let (Some(done), Some(Inline { echo, guard, read_at, .. }), Some(writer)) =
                    (done, inline.take(), direct.as_mut())
                {
                    let then = writer
                        .answer(echo, done.map_err(|p| panic_message(&p)), &link, read_at)
                        .await;
                    drop(guard);
                    slow = read_at.elapsed() >= adoption::PATIENCE;
                    if then != Then::GoOn {
                        break;
                    }
                }
            }
            read = tokio::time::timeout_at(deadline, reader.read_buf(&mut buf)) => match read {
                Ok(Ok(0)) => {
                    if !buf.is_empty() {
                        info!(buffered = buf.len(), "connection closed in the middle of a telegram; nothing forwarded");
                    }
                    break;
                }
                Ok(Ok(_)) => from_backlog = false,
                Ok(Err(e)) => {
                    // A TLS error after the handshake (a record that fails
                    // its check, a renegotiation refused) is a channel's
                    // doing, like a failed handshake: said at INFO. A reset
                    // is said when it cuts a telegram.
                    if e.get_ref().is_some_and(|i| i.is::<rustls::Error>()) {
                        let cut = if buf.is_empty() { "" } else { " in the middle of a telegram; nothing forwarded" };
                        info!(%e, buffered = buf.len(), "TLS error from the channel; connection closed{cut}");
                    } else if !buf.is_empty() {
                        info!(%e, buffered = buf.len(), "connection failed in the middle of a telegram; nothing forwarded");
                    } else {
                        debug!(%e, "read failed");
                    }
                    break;
                }
                // Waiting for our own answers is not idling.
                Err(_) if started.is_none() && link.pending.load(Ordering::SeqCst) > 0 => {}
                Err(_) => {
                    if started.is_some() {
                        info!(buffered = buf.len(), "telegram not completed within the read timeout; closing without an answer");
                    } else {
                        debug!("idle timeout; closing");
                    }
                    break;
                }
            },
            // An answer went out: the idle time counts from now.
            _ = link.answered.notified(), if queued => {}
            // Answers started late go into the writer's queue as it frees
            // slots, with the connection read on meanwhile.
            slot = queue_slot(&queue), if !started_late.is_empty() => match slot {
                Some(slot) => started_late.queue_first(slot),
                None => break,
            },
            // The writer stopped: the channel is gone, or a closing answer
            // was written, after which the telegrams held whole are queued
            // (at the top of the loop) before the reader ends.
            _ = link.stop.notified(), if queued => if !link.closing.load(Ordering::SeqCst) {
                break;
            },
            // Draining: a connection that holds nothing closes, unless the
            // channel's next bytes are already here (read, then answered).
            // Bytes already in the socket are read however long the
            // reactor takes to see them (within the read timeout: a busy
            // machine took longer than the settling wait); otherwise a
            // short wait for any the reactor has not marked yet. One taken
            // from the backlog by the drain waits for its channel's first
            // bytes as long as the drain lets connections finish: it was
            // open to its channel before the drain began.
            _ = in_flight.closing(), if holds_nothing => {
                let wait = if from_backlog {
                    CLOSE_GRACE
                } else if S::bytes_waiting(&reader) {
                    limits.read_timeout.max(SETTLE)
                } else {
                    SETTLE
                };
                if !read_settled(&mut reader, &mut buf, wait).await {
                    break;
                }
                from_backlog = false;
            }
        }
    }
    // The telegram in flight still gets its answer, as the queued ones do.
    if let Some(mut writer) = direct {
        if let Some(Inline {
            handling,
            echo,
            guard,
            read_at,
        }) = inline.take()
        {
            let done = handling.await.map_err(|p| panic_message(&p));
            writer.answer(echo, done, &link, read_at).await;
            drop(guard);
        }
        writer.shutdown().await;
    }
    if let Some(Queue { tx, task, .. }) = queue {
        // Those started late too, unless the channel is gone.
        started_late.queue_all(&tx).await;
        drop(tx);
        let _ = task.await;
    }
    // Bytes the channel sent that were never read (telegrams beyond its
    // in-flight limit behind a closing answer): read and dropped for a
    // moment, so that the close after the answers is a FIN, not a reset
    // that a lossy network could let overtake them.
    if S::bytes_waiting(&reader) {
        discard_unread(&mut reader).await;
    }
    Served::Ended
}

/// Reads and drops what the channel sent, for at most [`SETTLE`] and
/// 1 MiB, or until it closes its side.
///
/// The scratch buffer is on the heap, made only when a connection gets
/// here: an array would live in the connection's future, and every idle
/// connection would carry its 4 KiB (10,000 idle connections took 36 MB
/// more; docs/performance.md).
async fn discard_unread<R: tokio::io::AsyncRead + Unpin>(reader: &mut R) {
    let mut scratch = vec![0u8; 4096];
    let mut left = 1usize << 20;
    let _ = tokio::time::timeout(SETTLE, async {
        while left > 0 {
            match reader.read(&mut scratch).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    })
    .await;
}

/// How long a draining connection that holds nothing still reads before it
/// closes: enough for the reactor to see bytes already in a socket it took
/// back a moment ago (it reads a socket only once its event loop has marked
/// it readable), so they are answered (E903), not reset.
const SETTLE: Duration = Duration::from_millis(20);

/// Reads what the channel has sent, waiting at most `wait`: whether bytes
/// were added to `buf` (a read cut short by the wait loses none).
async fn read_settled<R: tokio::io::AsyncRead + Unpin>(
    reader: &mut R,
    buf: &mut BytesMut,
    wait: Duration,
) -> bool {
    matches!(
        tokio::time::timeout(wait, reader.read_buf(buf)).await,
        Ok(Ok(n)) if n > 0
    )
}

/// The answer to a telegram whose task failed (a panic: a bug, not an input).
/// The channel still gets its own header back and a truthful "don't know":
/// E901, since a POST may have gone before the task failed. The connection
/// stays open; the answer is counted like any other.
fn failed_task(echo: Echo, e: &str) -> (Echo, Reply) {
    tracing::error!(
        e,
        guid = echo.guid_str(),
        tx = echo.tx_code_str(),
        "telegram task failed; answered E901"
    );
    count_unrouted(Code::UNKNOWN);
    (
        echo,
        Reply {
            code: Code::UNKNOWN,
            body: Vec::new(),
            close: false,
        },
    )
}

/// Counts an answer given without a telegram's own task, like every answer
/// (`relayhub_telegrams_total` and the console), under no tx code.
fn count_unrouted(code: Code) {
    metrics::counter!(
        crate::metric_names::TELEGRAMS,
        "tx_code" => crate::metric_names::UNROUTED_TX,
        "code" => code.as_str().to_string()
    )
    .increment(1);
    crate::console_stats::count_untimed(crate::metric_names::UNROUTED_TX, code);
}

async fn write_answers<W: AsyncWrite + Unpin>(
    mut writer: AnswerWriter<W>,
    mut rx: mpsc::Receiver<Answer>,
    link: Arc<Link>,
) {
    while let Some(answer) = rx.recv().await {
        match answer {
            Answer::Telegram(task, echo, guard, permit, read_at) => {
                let done = match task.await {
                    Ok(Ok(answer)) => Ok(answer),
                    Ok(Err(panic)) => Err(panic_message(&panic)),
                    Err(e) => Err(e.to_string()),
                };
                let then = writer.answer(echo, done, &link, read_at).await;
                link.answered.notify_one();
                // Both before the permit is freed, which would let the
                // reader start (or read) one more telegram:
                match then {
                    Then::GoOn => {}
                    // The channel is gone: nobody would read an answer.
                    Then::Gone => rx.close(),
                    // The reader reads no more; the telegrams it already
                    // read whole (pipelined behind this one: queued, or
                    // waiting for room) are answered before the close, as
                    // the log counts them. The queue ends when the reader
                    // has queued the last of them (before, those waiting
                    // for room were dropped unanswered; found by a
                    // black-box probe).
                    Then::Close => link.closing.store(true, Ordering::SeqCst),
                }
                drop(guard);
                drop(permit);
                match then {
                    Then::GoOn => {}
                    Then::Gone => break,
                    Then::Close => link.stop.notify_one(),
                }
            }
            Answer::Unframeable => {
                count_unrouted(Code::FORMAT);
                writer
                    .write(&Echo::blank(), Code::FORMAT.as_str(), &[])
                    .await;
                break;
            }
        }
    }
    // Answers still queued (the channel went away) are dropped before the
    // shutdown, which is bounded like a write: a TLS stream's close waits
    // to flush what a channel that stopped reading will not take, and the
    // drain waits for this connection meanwhile.
    drop(rx);
    writer.shutdown().await;
    link.stop.notify_one();
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    use super::accept::connection_task;
    use crate::config::ServerConfig;

    /// A draining connection that holds nothing reads what already arrived
    /// before it closes, even on a socket the reactor took back a moment ago
    /// (as `Adopters::resume` does); with nothing there it waits no longer
    /// than [`SETTLE`].
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn read_settled_takes_what_arrived_on_a_socket_just_taken_back() {
        use std::io::Write;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        for _ in 0..20 {
            let mut channel = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let (hub, _) = listener.accept().unwrap();
            channel.write_all(b"0004ABCD").unwrap();
            let mut one = [0u8; 1];
            while hub.peek(&mut one).unwrap() == 0 {}
            hub.set_nonblocking(true).unwrap();
            let (mut reader, _writer) = TcpStream::from_std(hub).unwrap().into_split();
            let mut buf = BytesMut::new();
            assert!(
                read_settled(&mut reader, &mut buf, SETTLE).await,
                "8 bytes waiting, none read"
            );
            assert_eq!(&buf[..], b"0004ABCD");
            let began = Instant::now();
            assert!(!read_settled(&mut reader, &mut buf, SETTLE).await);
            assert!(began.elapsed() >= SETTLE);
        }
    }

    /// A draining connection tells bytes already in its socket from none,
    /// without waiting for the reactor to mark it readable: those are read
    /// within the read timeout, not only the settling wait.
    #[tokio::test]
    async fn a_plain_connection_sees_bytes_waiting_in_its_socket() {
        use std::io::Write;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut channel = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (hub, _) = listener.accept().unwrap();
        hub.set_nonblocking(true).unwrap();
        let (mut reader, _writer) = TcpStream::from_std(hub.try_clone().unwrap())
            .unwrap()
            .into_split();
        assert!(!<TcpStream as ChannelStream>::bytes_waiting(&reader));
        channel.write_all(b"0004AB").unwrap();
        // Until the bytes are here (a blocking peek on a clone).
        hub.set_nonblocking(false).unwrap();
        hub.peek(&mut [0u8; 1]).unwrap();
        hub.set_nonblocking(true).unwrap();
        assert!(<TcpStream as ChannelStream>::bytes_waiting(&reader));
        let mut buf = BytesMut::new();
        assert!(read_settled(&mut reader, &mut buf, Duration::from_secs(5)).await);
        assert_eq!(&buf[..], b"0004AB");
        assert!(!<TcpStream as ChannelStream>::bytes_waiting(&reader));
        drop(channel);
        assert!(
            !<TcpStream as ChannelStream>::bytes_waiting(&reader),
            "the end of the stream is no bytes"
        );
    }

    /// What an open connection costs while it idles is mostly the future
    /// its task runs: 10,000 idle connections must stay under 100 MB
    /// (docs/performance.md). In a debug build it is 3,344 bytes; a 4 KiB
    /// array held across an await gave 6,888, the TLS branch unboxed 5,304,
    /// and the connection's future awaited in a block of its own 6,672.
    #[tokio::test]
    async fn an_idle_connection_holds_a_small_future() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let _channel = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (stream, peer) = listener.accept().await.unwrap();
        let task = connection_task(
            stream,
            peer,
            None,
            Arc::new(PanicsOnPanic1),
            Limits::from(&ServerConfig::default()),
            Arc::new(InFlight::default()),
            Arc::new(Adopters::new()),
            Carry::default(),
            Arc::new(Semaphore::new(1)).try_acquire_owned().unwrap(),
            tracing::Span::none(),
        );
        let size = std::mem::size_of_val(&task);
        assert!(
            size <= 4096,
            "a connection's future is {size} bytes: every idle connection holds it"
        );
    }

    /// The future [`handling`] boxes is one allocation per telegram: within
    /// the 1,032 bytes glibc's per-thread cache serves, or every telegram
    /// takes a trip to the shared arena (docs/performance.md, "A telegram's
    /// future under 1 KiB"). 1,024 bytes in a debug build now (944 when
    /// that was written); a block around the hub's future made it 1,040 to
    /// 1,072, and the rules at the start passed by value 1,040.
    #[tokio::test]
    async fn a_telegrams_future_fits_the_allocators_cache() {
        let hub = Arc::new(crate::relay::test_hub("http://127.0.0.1:9".into()));
        let peer = IpAddr::from([127, 0, 0, 1]);
        let boxed = handling(hub, Bytes::new(), peer, None, Instant::now(), true);
        let size = std::mem::size_of_val(&*boxed.0);
        assert!(
            size <= 1032,
            "a telegram's future is {size} bytes, past glibc's per-thread cache"
        );
    }

    /// Answers 0000 with the request's header, except that a telegram whose
    /// tx code is `PANIC1` makes its task panic (a bug in the hub).
    struct PanicsOnPanic1;

    impl Answerer for PanicsOnPanic1 {
        async fn answer(
            self: Arc<Self>,
            telegram: Bytes,
            _peer: IpAddr,
            _cert: Option<Arc<ClientCert>>,
            _read_at: Instant,
            _deferred: bool,
        ) -> (Echo, Reply) {
            if telegram.starts_with(b"PANIC1") {
                panic!("a bug in a telegram's task");
            }
            (
                Echo::from_telegram(&telegram),
                Reply {
                    code: Code::OK,
                    body: Vec::new(),
                    close: false,
                },
            )
        }
    }

    /// Answers like [`PanicsOnPanic1`], except that a `BLOCK1` telegram
    /// makes a "core call" through a caller pool (so, on an adopter, in
    /// place) that blocks until the test releases it, and reports the name
    /// of the thread it ran on.
    struct Scripted {
        calls: crate::core_client::caller::Callers,
        release: Arc<std::sync::Mutex<std::sync::mpsc::Receiver<()>>>,
        ran_on: std::sync::mpsc::Sender<String>,
    }

    impl Answerer for Scripted {
        async fn answer(
            self: Arc<Self>,
            telegram: Bytes,
            peer: IpAddr,
            cert: Option<Arc<ClientCert>>,
            read_at: Instant,
            _deferred: bool,
        ) -> (Echo, Reply) {
            // BLOCK1 waits for its call; BLOCKD gives up at a deadline 300 ms
            // away and answers E901, as the hub does at the budget.
            // SLOWDL's call takes 400 ms (a slow core) against a 200 ms
            // deadline, releases or not.
            let (deadline, slow_core) = match &telegram[..6] {
                b"BLOCK1" => (Some(Duration::from_secs(30)), None),
                b"BLOCKD" => (Some(Duration::from_millis(300)), None),
                b"SLOWDL" => (
                    Some(Duration::from_millis(200)),
                    Some(Duration::from_millis(400)),
                ),
                _ => (None, None),
            };
            if let Some(deadline) = deadline {
                let (tx, rx) = tokio::sync::oneshot::channel();
                let release = self.release.clone();
                let ran_on = self.ran_on.clone();
                let work: crate::core_client::caller::Work = Box::new(move || {
                    let name = std::thread::current().name().unwrap_or("").to_string();
                    let _ = ran_on.send(name);
                    match slow_core {
                        Some(takes) => std::thread::sleep(takes),
                        None => {
                            let _ = release.lock().unwrap().recv();
                        }
                    }
                    let _ = tx.send(());
                });
                let due = Instant::now() + deadline;
                assert!(self.calls.run_or_stash(work, due).is_ok());
                if tokio::time::timeout_at(due, rx).await.is_err() {
                    return (
                        Echo::from_telegram(&telegram),
                        Reply {
                            code: Code::UNKNOWN,
                            body: Vec::new(),
                            close: false,
                        },
                    );
                }
            }
            Arc::new(PanicsOnPanic1)
                .answer(telegram, peer, cert, read_at, false)
                .await
        }
    }

    /// A [`Scripted`] hub, the sender that releases its blocked calls, and
    /// the receiver of the names of the threads they ran on.
    fn scripted() -> (
        Scripted,
        std::sync::mpsc::Sender<()>,
        std::sync::mpsc::Receiver<String>,
    ) {
        let (release, released) = std::sync::mpsc::channel();
        let (ran_on, call_thread) = std::sync::mpsc::channel();
        let hub = Scripted {
            calls: crate::core_client::caller::Callers::new("test-caller"),
            release: Arc::new(std::sync::Mutex::new(released)),
            ran_on,
        };
        (hub, release, call_thread)
    }

    /// Closes the channel's end; the connection's task must end with it and
    /// leave nothing in flight.
    async fn ends_with_the_channel(
        channel: TcpStream,
        server: tokio::task::JoinHandle<()>,
        in_flight: &InFlight,
    ) {
        drop(channel);
        tokio::time::timeout(Duration::from_secs(10), server)
            .await
            .expect("the connection ends with the channel's close")
            .unwrap();
        assert_eq!(in_flight.count.load(Ordering::SeqCst), 0);
    }

    fn header(tx: &str, guid: &str) -> Vec<u8> {
        format!("{tx}{guid}IBANK   20261129132000    ").into_bytes()
    }

    /// Writes telegrams in one write (pipelined when several).
    async fn send(stream: &mut TcpStream, telegrams: &[&[u8]]) {
        let codec = FrameCodec::new(PrefixMode::Ascii, 4096);
        let mut framed = BytesMut::new();
        for telegram in telegrams {
            codec.encode(telegram, &mut framed).unwrap();
        }
        stream.write_all(&framed).await.unwrap();
    }

    /// Writes a telegram and reads one answer (bounded).
    async fn exchange(stream: &mut TcpStream, telegram: &[u8]) -> Vec<u8> {
        send(stream, &[telegram]).await;
        read_answer(stream).await
    }

    /// Reads one answer (bounded).
    async fn read_answer(stream: &mut TcpStream) -> Vec<u8> {
        let mut prefix = [0u8; 4];
        let read = async {
            stream.read_exact(&mut prefix).await?;
            let len: usize = std::str::from_utf8(&prefix).unwrap().parse().unwrap();
            let mut answer = vec![0u8; len];
            stream.read_exact(&mut answer).await?;
            Ok::<_, std::io::Error>(answer)
        };
        tokio::time::timeout(Duration::from_secs(10), read)
            .await
            .expect("an answer within 10 s")
            .expect("an answer, not a closed connection")
    }

    /// One channel connection served by `serve_connection` with the
    /// [`PanicsOnPanic1`] hub, on a port of its own: the channel's end, the
    /// in-flight count, and the task that ends with the connection.
    async fn one_connection() -> (TcpStream, Arc<InFlight>, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = Limits::from(&ServerConfig::default());
        let in_flight = Arc::new(InFlight::default());
        let server = tokio::spawn({
            let in_flight = in_flight.clone();
            async move {
                let (stream, peer) = listener.accept().await.unwrap();
                serve_connection(
                    stream,
                    peer,
                    None,
                    Arc::new(PanicsOnPanic1),
                    limits,
                    in_flight,
                    Carry::default(),
                    None,
                )
                .await;
            }
        });
        let channel = TcpStream::connect(addr).await.unwrap();
        (channel, in_flight, server)
    }

    /// One channel connection served by `serve_plain` with adopters, on a
    /// port of its own: the channel's end, the in-flight count, the task.
    async fn one_lent_connection<H: Answerer>(
        hub: H,
    ) -> (TcpStream, Arc<InFlight>, tokio::task::JoinHandle<()>) {
        one_lent_connection_with(hub, Arc::new(Adopters::new())).await
    }

    /// [`one_lent_connection`] with these adopters.
    async fn one_lent_connection_with<H: Answerer>(
        hub: H,
        adopters: Arc<Adopters>,
    ) -> (TcpStream, Arc<InFlight>, tokio::task::JoinHandle<()>) {
        let limits = Limits::from(&ServerConfig::default());
        let in_flight = Arc::new(InFlight::default());
        let (channel, server) = served(hub, limits, Some(adopters), in_flight.clone()).await;
        (channel, in_flight, server)
    }

    /// A connection served with the [`Scripted`] hub and lent after a quick
    /// telegram: the channel's end, the in-flight count, the task, the
    /// releaser of blocked calls and the names of the threads they ran on.
    async fn lent_scripted() -> (
        TcpStream,
        Arc<InFlight>,
        tokio::task::JoinHandle<()>,
        std::sync::mpsc::Sender<()>,
        std::sync::mpsc::Receiver<String>,
    ) {
        lent_scripted_with(Arc::new(Adopters::new())).await
    }

    /// [`lent_scripted`] with these adopters.
    async fn lent_scripted_with(
        adopters: Arc<Adopters>,
    ) -> (
        TcpStream,
        Arc<InFlight>,
        tokio::task::JoinHandle<()>,
        std::sync::mpsc::Sender<()>,
        std::sync::mpsc::Receiver<String>,
    ) {
        let (hub, release, call_thread) = scripted();
        let (mut channel, in_flight, server) = one_lent_connection_with(hub, adopters).await;
        let quick = "20261129IBANK0000000000000000QCK";
        let answer = exchange(&mut channel, &header("TRF001", quick)).await;
        assert_eq!(&answer[60..64], b"0000");
        (channel, in_flight, server, release, call_thread)
    }

    /// Sends a `BLOCKD` telegram: its call blocks the adopter past its
    /// deadline, which alone takes the telegram back; answered E901 then.
    async fn blocked_past_its_deadline(
        channel: &mut TcpStream,
        held: &str,
        call_thread: std::sync::mpsc::Receiver<String>,
    ) {
        let answer = exchange(channel, &header("BLOCKD", held)).await;
        assert_eq!(&answer[..38], format!("BLOCKD{held}").as_bytes());
        assert_eq!(&answer[60..64], b"E901", "answered at the deadline");
        let thread = tokio::task::spawn_blocking(move || call_thread.recv().unwrap())
            .await
            .unwrap();
        assert_eq!(thread, "relayhub-conn");
    }

    /// Waits (bounded) until `in_flight` telegrams are read and unanswered.
    async fn until_in_flight(in_flight: &InFlight, n: usize) {
        let waited = tokio::time::timeout(Duration::from_secs(10), async {
            while in_flight.count.load(Ordering::SeqCst) != n {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        });
        waited.await.unwrap_or_else(|_| {
            panic!(
                "{n} in flight never seen (now {})",
                in_flight.count.load(Ordering::SeqCst)
            )
        });
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lent_connection_answers_in_order_and_a_panic_is_e901() {
        let (mut channel, in_flight, server) = one_lent_connection(PanicsOnPanic1).await;
        let guid = "20261129IBANK0000000000000000PNC";
        let answer = exchange(&mut channel, &header("PANIC1", guid)).await;
        assert_eq!(&answer[..38], format!("PANIC1{guid}").as_bytes());
        assert_eq!(&answer[60..64], b"E901");
        for i in 0..20 {
            let g = format!("20261129IBANK00000000000000000{i:02}");
            let answer = exchange(&mut channel, &header("TRF001", &g)).await;
            assert_eq!(&answer[..38], format!("TRF001{g}").as_bytes());
            assert_eq!(&answer[60..64], b"0000");
        }
        // Pipelined: back to the reactor, answered in order.
        let (a, b) = (
            "20261129IBANK0000000000000000AAA",
            "20261129IBANK0000000000000000BBB",
        );
        send(&mut channel, &[&header("PANIC1", a), &header("TRF001", b)]).await;
        let first = read_answer(&mut channel).await;
        assert_eq!(&first[..38], format!("PANIC1{a}").as_bytes());
        assert_eq!(&first[60..64], b"E901");
        let second = read_answer(&mut channel).await;
        assert_eq!(&second[..38], format!("TRF001{b}").as_bytes());
        assert_eq!(&second[60..64], b"0000");
        // And lent again.
        let answer = exchange(&mut channel, &header("TRF001", a)).await;
        assert_eq!(&answer[60..64], b"0000");

        ends_with_the_channel(channel, server, &in_flight).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_telegram_sent_during_a_long_call_takes_the_connection_back_to_the_reactor() {
        let (mut channel, in_flight, server, release, call_thread) = lent_scripted().await;

        let held = "20261129IBANK0000000000000000HLD";
        send(&mut channel, &[&header("BLOCK1", held)]).await;
        let thread = tokio::task::spawn_blocking(move || call_thread.recv().unwrap())
            .await
            .unwrap();
        assert_eq!(
            thread, "relayhub-conn",
            "the call runs in place, on the connection's adopter"
        );
        // The call blocks its adopter; the next telegram makes the watched
        // connection readable, and the reactor reads it meanwhile.
        let next = "20261129IBANK0000000000000000NXT";
        send(&mut channel, &[&header("TRF001", next)]).await;
        until_in_flight(&in_flight, 2).await;
        release.send(()).unwrap();
        let first = read_answer(&mut channel).await;
        assert_eq!(&first[..38], format!("BLOCK1{held}").as_bytes());
        assert_eq!(&first[60..64], b"0000");
        let second = read_answer(&mut channel).await;
        assert_eq!(&second[..38], format!("TRF001{next}").as_bytes());
        assert_eq!(&second[60..64], b"0000");

        ends_with_the_channel(channel, server, &in_flight).await;
    }

    /// A channel connection served by `serve_plain` with `limits` and
    /// `adopters`: the channel's end and the task.
    async fn one_plain_connection<H: Answerer>(
        hub: H,
        limits: Limits,
        adopters: Option<Arc<Adopters>>,
    ) -> (TcpStream, tokio::task::JoinHandle<()>) {
        served(hub, limits, adopters, Arc::new(InFlight::default())).await
    }

    /// One channel connection served by `serve_plain`, on a port of its
    /// own: the channel's end and the task.
    async fn served<H: Answerer>(
        hub: H,
        limits: Limits,
        adopters: Option<Arc<Adopters>>,
        in_flight: Arc<InFlight>,
    ) -> (TcpStream, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (stream, peer) = listener.accept().await.unwrap();
            stream.set_nodelay(true).unwrap();
            let (hub, carry) = (Arc::new(hub), Carry::default());
            serve_plain(stream, peer, hub, limits, in_flight, adopters, carry).await;
        });
        let channel = TcpStream::connect(addr).await.unwrap();
        (channel, server)
    }

    /// Sends a telegram one byte every 20 ms (about 1.4 s in all) after a
    /// quick exchange, with a 300 ms read timeout; the connection must close
    /// rather than answer it.
    async fn a_trickle_past_the_read_timeout_is_closed(adopters: Option<Arc<Adopters>>) {
        let got = trickle_past_the_read_timeout(adopters).await;
        assert!(
            got.is_none(),
            "a telegram that took 1.4 s to arrive (read timeout 300 ms) was answered: {:?}",
            got.map(|b| String::from_utf8_lossy(&b).into_owned())
        );
    }

    /// What the channel reads after the trickle: `None` for a closed
    /// connection, else the answer's bytes.
    async fn trickle_past_the_read_timeout(adopters: Option<Arc<Adopters>>) -> Option<Vec<u8>> {
        let limits = Limits {
            read_timeout: Duration::from_millis(300),
            ..Limits::from(&ServerConfig::default())
        };
        let (mut channel, server) = one_plain_connection(PanicsOnPanic1, limits, adopters).await;
        let quick = "20261129IBANK0000000000000000QCK";
        let answer = exchange(&mut channel, &header("TRF001", quick)).await;
        assert_eq!(&answer[60..64], b"0000");
        let codec = FrameCodec::new(PrefixMode::Ascii, 4096);
        let mut framed = BytesMut::new();
        let slow = "20261129IBANK0000000000000000SLW";
        codec.encode(&header("TRF001", slow), &mut framed).unwrap();
        let began = Instant::now();
        for byte in framed.iter() {
            if channel.write_all(&[*byte]).await.is_err() {
                // Closed under the channel's feet.
                server.abort();
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(began.elapsed() > Duration::from_millis(900));
        let mut got = vec![0u8; 256];
        let read = tokio::time::timeout(Duration::from_secs(5), channel.read(&mut got)).await;
        server.abort();
        match read {
            Ok(Ok(0)) | Ok(Err(_)) => None,
            Ok(Ok(n)) => Some(got[..n].to_vec()),
            Err(_) => panic!("neither closed nor answered within 5 s"),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_reactor_closes_a_telegram_that_trickles_past_the_read_timeout() {
        a_trickle_past_the_read_timeout_is_closed(None).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lent_connection_closes_a_telegram_that_trickles_past_the_read_timeout() {
        a_trickle_past_the_read_timeout_is_closed(Some(Arc::new(Adopters::new()))).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_telegram_is_answered_when_no_adopter_thread_can_start() {
        // A stack no thread can have: every lend fails to start its adopter.
        let adopters = Arc::new(Adopters::with_stack(1 << 62));
        let limits = Limits::from(&ServerConfig::default());
        let (mut channel, server) =
            one_plain_connection(PanicsOnPanic1, limits, Some(adopters)).await;
        let guid = "20261129IBANK0000000000000000NTH";
        send(&mut channel, &[&header("TRF001", guid)]).await;
        let mut prefix = [0u8; 4];
        let read =
            tokio::time::timeout(Duration::from_secs(5), channel.read_exact(&mut prefix)).await;
        server.abort();
        assert!(
            matches!(read, Ok(Ok(_))),
            "no answer within 5 s when no adopter can start: {read:?}"
        );
    }

    /// Starts a "core call" (left in the stash on an adopter) that blocks
    /// until released, then panics in the same poll: the call's future is
    /// gone, nobody waits for the call.
    struct StashThenPanic {
        calls: crate::core_client::caller::Callers,
        release: Arc<std::sync::Mutex<std::sync::mpsc::Receiver<()>>>,
        ran: Arc<std::sync::atomic::AtomicBool>,
    }

    impl Answerer for StashThenPanic {
        async fn answer(
            self: Arc<Self>,
            telegram: Bytes,
            peer: IpAddr,
            cert: Option<Arc<ClientCert>>,
            read_at: Instant,
            _deferred: bool,
        ) -> (Echo, Reply) {
            if telegram.starts_with(b"STPNC1") {
                let release = self.release.clone();
                let ran = self.ran.clone();
                let work: crate::core_client::caller::Work = Box::new(move || {
                    ran.store(true, Ordering::SeqCst);
                    let _ = release
                        .lock()
                        .unwrap()
                        .recv_timeout(Duration::from_secs(30));
                });
                let due = Instant::now() + Duration::from_secs(30);
                assert!(self.calls.run_or_stash(work, due).is_ok());
                panic!("a bug after the call started");
            }
            Arc::new(PanicsOnPanic1)
                .answer(telegram, peer, cert, read_at, false)
                .await
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_answer_on_an_adopter_does_not_wait_for_a_call_nobody_awaits() {
        let (release, released) = std::sync::mpsc::channel();
        let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let hub = StashThenPanic {
            calls: crate::core_client::caller::Callers::new("test-caller"),
            release: Arc::new(std::sync::Mutex::new(released)),
            ran: ran.clone(),
        };
        let limits = Limits::from(&ServerConfig::default());
        let adopters = Some(Arc::new(Adopters::new()));
        let (mut channel, server) = one_plain_connection(hub, limits, adopters).await;
        let guid = "20261129IBANK0000000000000000STP";
        send(&mut channel, &[&header("STPNC1", guid)]).await;
        let mut prefix = [0u8; 4];
        let read =
            tokio::time::timeout(Duration::from_secs(3), channel.read_exact(&mut prefix)).await;
        let ran_before_release = ran.load(Ordering::SeqCst);
        let _ = release.send(());
        server.abort();
        assert!(
            matches!(read, Ok(Ok(_))),
            "the E901 was not written within 3 s (the adopter ran the orphaned call first: {ran_before_release})"
        );
        assert!(!ran_before_release, "a call whose future is gone was run");
    }

    /// The telegram in flight when its connection comes back from an
    /// adopter is answered even when the socket cannot be registered with
    /// the reactor again (`epoll` out of memory or watches): on its own,
    /// then the connection closes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_telegram_is_answered_when_its_connection_cannot_return_to_the_reactor() {
        let adopters = Arc::new(Adopters::new());
        let (mut channel, in_flight, server, release, call_thread) =
            lent_scripted_with(adopters.clone()).await;

        adopters.refuse_return.store(true, Ordering::SeqCst);
        let held = "20261129IBANK0000000000000000RFS";
        blocked_past_its_deadline(&mut channel, held, call_thread).await;
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(10), channel.read_to_end(&mut rest));
        assert!(
            matches!(closed.await, Ok(Ok(0))),
            "the connection closes after the answer, with nothing more: {rest:?}"
        );
        release.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), server)
            .await
            .expect("the connection's task ends")
            .unwrap();
        assert_eq!(in_flight.count.load(Ordering::SeqCst), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_past_its_deadline_is_answered_by_the_reactor_while_it_goes_on() {
        let (mut channel, in_flight, server, release, call_thread) = lent_scripted().await;

        // The call blocks its adopter past its deadline, and nothing else
        // comes from the channel: the deadline alone takes the telegram back.
        let held = "20261129IBANK0000000000000000DUE";
        blocked_past_its_deadline(&mut channel, held, call_thread).await;
        // The connection goes on while the call still blocks its adopter.
        let next = "20261129IBANK0000000000000000NXT";
        let answer = exchange(&mut channel, &header("TRF001", next)).await;
        assert_eq!(&answer[60..64], b"0000");
        release.send(()).unwrap();

        ends_with_the_channel(channel, server, &in_flight).await;
    }

    #[tokio::test]
    async fn a_telegram_task_that_panics_is_answered_e901_with_its_own_header() {
        let (mut channel, in_flight, server) = one_connection().await;

        let guid = "20261129IBANK0000000000000000PNC";
        let answer = exchange(&mut channel, &header("PANIC1", guid)).await;
        assert_eq!(
            std::str::from_utf8(&answer).unwrap()[..64],
            format!(
                "PANIC1{guid}IBANK   {}E901",
                &std::str::from_utf8(&answer).unwrap()[46..60]
            ),
            "the request's own header and E901 (a POST may have gone)"
        );

        // The connection goes on.
        let next = "20261129IBANK0000000000000000NXT";
        let answer = exchange(&mut channel, &header("TRF001", next)).await;
        assert_eq!(&answer[..38], format!("TRF001{next}").as_bytes());
        assert_eq!(&answer[60..64], b"0000");

        ends_with_the_channel(channel, server, &in_flight).await;
    }

    /// The same with both telegrams in one write: the first is handled in a
    /// task of its own (pipelined), and the answers keep their order.
    #[tokio::test]
    async fn a_pipelined_telegram_that_panics_is_answered_e901_in_its_place() {
        let (mut channel, in_flight, server) = one_connection().await;

        let guid = "20261129IBANK0000000000000000PNC";
        let next = "20261129IBANK0000000000000000NXT";
        send(
            &mut channel,
            &[&header("PANIC1", guid), &header("TRF001", next)],
        )
        .await;
        let first = read_answer(&mut channel).await;
        assert_eq!(&first[..38], format!("PANIC1{guid}").as_bytes());
        assert_eq!(&first[60..64], b"E901");
        let second = read_answer(&mut channel).await;
        assert_eq!(&second[..38], format!("TRF001{next}").as_bytes());
        assert_eq!(&second[60..64], b"0000");

        // And on, with one at a time again.
        let last = "20261129IBANK0000000000000000LST";
        let answer = exchange(&mut channel, &header("TRF001", last)).await;
        assert_eq!(&answer[..38], format!("TRF001{last}").as_bytes());
        assert_eq!(&answer[60..64], b"0000");

        ends_with_the_channel(channel, server, &in_flight).await;
    }

    /// Answers 0000 at once, saying which telegram started and whether a
    /// `HOLD01` telegram was held then: that one waits until the test
    /// releases it, and a `HOLDB1` one until `b` is notified. Says too which
    /// telegrams are counted as waiting for room. The last start is
    /// `work_after` after each telegram's read.
    struct Budgeted {
        release: Arc<tokio::sync::Notify>,
        b: Arc<tokio::sync::Notify>,
        holding: Arc<AtomicBool>,
        started: mpsc::UnboundedSender<(String, bool)>,
        waited: mpsc::UnboundedSender<String>,
        work_after: Duration,
    }

    /// What a [`Budgeted`] hub says: the telegrams that start (with whether
    /// `HOLD01` was held then), and those counted as waiting.
    struct Reports {
        starts: mpsc::UnboundedReceiver<(String, bool)>,
        waits: mpsc::UnboundedReceiver<String>,
    }

    impl Budgeted {
        fn new(work_after: Duration) -> (Budgeted, Reports) {
            let (started, starts) = mpsc::unbounded_channel();
            let (waited, waits) = mpsc::unbounded_channel();
            let hub = Budgeted {
                release: Arc::new(tokio::sync::Notify::new()),
                b: Arc::new(tokio::sync::Notify::new()),
                holding: Arc::new(AtomicBool::new(false)),
                started,
                waited,
                work_after,
            };
            (hub, Reports { starts, waits })
        }

        /// Lets the held `HOLD01` telegram go on.
        fn releaser(&self) -> impl FnOnce() + use<> {
            let (holding, release) = (self.holding.clone(), self.release.clone());
            move || {
                holding.store(false, Ordering::SeqCst);
                release.notify_one();
            }
        }
    }

    impl Answerer for Budgeted {
        async fn answer(
            self: Arc<Self>,
            telegram: Bytes,
            peer: IpAddr,
            cert: Option<Arc<ClientCert>>,
            read_at: Instant,
            _deferred: bool,
        ) -> (Echo, Reply) {
            let holds = telegram.starts_with(b"HOLD01");
            if holds {
                self.holding.store(true, Ordering::SeqCst);
            }
            let guid = Echo::from_telegram(&telegram).guid_str().to_string();
            let _ = self
                .started
                .send((guid, self.holding.load(Ordering::SeqCst)));
            if holds {
                self.release.notified().await;
            }
            if telegram.starts_with(b"HOLDB1") {
                self.b.notified().await;
            }
            Arc::new(PanicsOnPanic1)
                .answer(telegram, peer, cert, read_at, false)
                .await
        }

        fn waiting_to_start(&self, echo: &Echo) -> bool {
            let _ = self.waited.send(echo.guid_str().to_string());
            false
        }

        fn last_start(&self, read_at: Instant) -> Option<Instant> {
            Some(read_at + self.work_after)
        }
    }

    /// A connection that takes one telegram at a time, sent a `HOLD01`
    /// telegram that holds it (until `release`) and seven transfers behind
    /// it, all past their last start at once; GUIDs by `g`.
    struct Behind {
        channel: TcpStream,
        server: tokio::task::JoinHandle<()>,
        in_flight: Arc<InFlight>,
        reports: Reports,
        release: Box<dyn FnOnce()>,
        telegrams: Vec<Vec<u8>>,
    }

    async fn seven_behind_a_held_one(g: impl Fn(u32) -> String) -> Behind {
        let (hub, reports) = Budgeted::new(Duration::ZERO);
        let release = Box::new(hub.releaser());
        let limits = Limits {
            max_in_flight_per_connection: 1,
            ..Limits::from(&ServerConfig::default())
        };
        let in_flight = Arc::new(InFlight::default());
        let (mut channel, server) = served(hub, limits, None, in_flight.clone()).await;
        let mut telegrams = vec![header("HOLD01", &g(0))];
        telegrams.extend((1..8).map(|i| header("TRF001", &g(i))));
        send(
            &mut channel,
            &telegrams.iter().map(Vec::as_slice).collect::<Vec<_>>(),
        )
        .await;
        Behind {
            channel,
            server,
            in_flight,
            reports,
            release,
            telegrams,
        }
    }

    /// Telegrams pipelined behind one that holds the connection's only room
    /// start once their time to start has passed, without room, and are
    /// answered in their order right behind it (before, each waited for the
    /// one ahead of it to be answered: with thousands of budgets ending
    /// together, answers came past the budget; a black-box probe). More of
    /// them than the writer's queue holds (twice the in-flight limit) all
    /// start at their last start too (before, those beyond the queue
    /// started only as it moved: with a journal that reads a row to answer
    /// them, too late; found by a review).
    #[tokio::test]
    async fn telegrams_whose_budget_ran_out_waiting_start_without_room() {
        let g = |i: u32| format!("20261129IBANK0000000000000BYND{i:02}");
        let Behind {
            mut channel,
            server,
            in_flight,
            mut reports,
            release,
            telegrams,
        } = seven_behind_a_held_one(g).await;
        let mut seen = Vec::new();
        while seen.len() < telegrams.len() {
            let (guid, holding) =
                tokio::time::timeout(Duration::from_secs(10), reports.starts.recv())
                    .await
                    .unwrap_or_else(|_| panic!("only {seen:?} started while the first is held"))
                    .expect("the hub is alive");
            assert!(holding, "{guid} started while the first is held");
            seen.push(guid);
        }
        assert_eq!(
            seen,
            (0..8).map(g).collect::<Vec<_>>(),
            "started in their order"
        );
        release();
        for (i, telegram) in telegrams.iter().enumerate() {
            let answer = read_answer(&mut channel).await;
            assert_eq!(
                &answer[..38],
                &telegram[..38],
                "telegram {i}: answered in order"
            );
            assert_eq!(&answer[60..64], b"0000");
        }
        ends_with_the_channel(channel, server, &in_flight).await;
    }

    /// Telegrams started past their last start, their answers still waiting
    /// for the writer's queue, then the channel's close or bytes that frame
    /// no telegram: every answer is written in order, E102 last, then the
    /// connection ends.
    #[tokio::test]
    async fn a_close_or_unframeable_bytes_behind_telegrams_started_late_keep_their_order() {
        for eof in [false, true] {
            let g = |i: u32| format!("20261129IBANK0000000000000CLOS{i:02}");
            let Behind {
                mut channel,
                server,
                in_flight,
                mut reports,
                release,
                telegrams,
            } = seven_behind_a_held_one(g).await;
            if eof {
                channel.shutdown().await.unwrap();
            } else {
                channel.write_all(b"XXXXgarbage").await.unwrap();
            }
            for _ in 0..telegrams.len() {
                tokio::time::timeout(Duration::from_secs(10), reports.starts.recv())
                    .await
                    .unwrap();
            }
            release();
            for (i, telegram) in telegrams.iter().enumerate() {
                let answer = read_answer(&mut channel).await;
                assert_eq!(
                    &answer[..38],
                    &telegram[..38],
                    "eof={eof} telegram {i}: in order"
                );
            }
            if !eof {
                let answer = read_answer(&mut channel).await;
                assert_eq!(&answer[60..64], b"E102", "E102 last");
            }
            let mut rest = Vec::new();
            let _ =
                tokio::time::timeout(Duration::from_secs(5), channel.read_to_end(&mut rest)).await;
            assert!(rest.is_empty(), "nothing more: {rest:?}");
            tokio::time::timeout(Duration::from_secs(10), server)
                .await
                .unwrap()
                .unwrap();
            assert_eq!(in_flight.count.load(Ordering::SeqCst), 0);
        }
    }

    /// The writer's queue full of telegrams that went in without room, and
    /// a permit free: the next telegram still counts as waiting, and the
    /// connection is read on meanwhile (before, it waited for a slot
    /// uncounted and unread; found by a review).
    #[tokio::test]
    async fn a_telegram_that_finds_the_queue_full_waits_counted() {
        let (
            hub,
            Reports {
                mut starts,
                mut waits,
            },
        ) = Budgeted::new(Duration::ZERO);
        let (release_a, b) = (hub.releaser(), hub.b.clone());
        // Two in flight: four slots in the writer's queue.
        let limits = Limits {
            max_in_flight_per_connection: 2,
            ..Limits::from(&ServerConfig::default())
        };
        let in_flight = Arc::new(InFlight::default());
        let (mut channel, server) = served(hub, limits, None, in_flight.clone()).await;
        let g = |i: u32| format!("20261129IBANK0000000000000FULL{i:02}");
        async fn next<T>(rx: &mut mpsc::UnboundedReceiver<T>) -> Option<T> {
            tokio::time::timeout(Duration::from_secs(10), rx.recv())
                .await
                .ok()
                .flatten()
        }
        // A and B hold the room; 2 to 5 are past their last start: 2, 3
        // and 4 fill the queue behind B, 5 waits for a slot.
        let mut first = vec![header("HOLD01", &g(0)), header("HOLDB1", &g(1))];
        first.extend((2..6).map(|i| header("TRF001", &g(i))));
        send(
            &mut channel,
            &first.iter().map(Vec::as_slice).collect::<Vec<_>>(),
        )
        .await;
        let mut seen = Vec::new();
        while !seen.contains(&g(4)) {
            seen.push(next(&mut starts).await.expect("2 to 4 start").0);
        }
        // A answered: its permit frees, the writer takes B out and waits
        // for it, and 5 takes the slot that frees, without a permit: the
        // queue is full (2 to 5) and A's permit is free.
        release_a();
        assert_eq!(&read_answer(&mut channel).await[6..38], g(0).as_bytes());
        while !seen.contains(&g(5)) {
            seen.push(next(&mut starts).await.expect("5 starts").0);
        }
        while waits.try_recv().is_ok() {}
        // 6 and then 7 come: each counted as waiting, so read on.
        send(&mut channel, &[&header("TRF001", &g(6))]).await;
        assert_eq!(next(&mut waits).await, Some(g(6)), "6 waits counted");
        send(&mut channel, &[&header("TRF001", &g(7))]).await;
        assert_eq!(
            next(&mut waits).await,
            Some(g(7)),
            "7 is read while 6 waits"
        );
        b.notify_one();
        for i in 1..8 {
            assert_eq!(
                &read_answer(&mut channel).await[6..38],
                g(i).as_bytes(),
                "in order"
            );
        }
        ends_with_the_channel(channel, server, &in_flight).await;
    }

    /// With budget left, a telegram behind the held one waits for its room.
    #[tokio::test]
    async fn telegrams_with_budget_left_wait_for_room() {
        let (hub, mut reports) = Budgeted::new(Duration::from_secs(3600));
        let release = hub.releaser();
        let limits = Limits {
            max_in_flight_per_connection: 1,
            ..Limits::from(&ServerConfig::default())
        };
        let in_flight = Arc::new(InFlight::default());
        let (mut channel, server) = served(hub, limits, None, in_flight.clone()).await;
        let held = "20261129IBANK000000000000000HOLD";
        let behind = "20261129IBANK00000000000000BEHND";
        send(
            &mut channel,
            &[&header("HOLD01", held), &header("TRF001", behind)],
        )
        .await;
        assert_eq!(reports.starts.recv().await, Some((held.to_string(), true)));
        // The second starts only once the first is answered.
        release();
        let answer = read_answer(&mut channel).await;
        assert_eq!(&answer[6..38], held.as_bytes());
        let second = reports.starts.recv().await;
        assert_eq!(
            second,
            Some((behind.to_string(), false)),
            "not while the first is held"
        );
        let answer = read_answer(&mut channel).await;
        assert_eq!(&answer[6..38], behind.as_bytes());
        ends_with_the_channel(channel, server, &in_flight).await;
    }

    /// Every answer written after its telegram's budget is counted, the
    /// pipelined ones (written by the connection's writer task) and the one
    /// answered in place alike; none within the budget is.
    #[test]
    fn answers_written_past_their_budget_are_counted() {
        for (budget, want) in [(Duration::ZERO, 3), (Duration::from_secs(3600), 0)] {
            let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
            let handle = recorder.handle();
            metrics::with_local_recorder(&recorder, || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                runtime.block_on(async {
                    let limits = Limits {
                        budget,
                        ..Limits::from(&ServerConfig::default())
                    };
                    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
                    let addr = listener.local_addr().unwrap();
                    let in_flight = Arc::new(InFlight::default());
                    let server = tokio::spawn({
                        let in_flight = in_flight.clone();
                        async move {
                            let (stream, peer) = listener.accept().await.unwrap();
                            let hub = Arc::new(PanicsOnPanic1);
                            let carry = Carry::default();
                            serve_connection(
                                stream, peer, None, hub, limits, in_flight, carry, None,
                            )
                            .await;
                        }
                    });
                    let mut channel = TcpStream::connect(addr).await.unwrap();
                    let guids = [
                        "20261129IBANK0000000000000000PB1",
                        "20261129IBANK0000000000000000PB2",
                        "20261129IBANK0000000000000000PB3",
                    ];
                    // One alone (answered in place), then two pipelined
                    // (through the writer task).
                    let answer = exchange(&mut channel, &header("TRF001", guids[0])).await;
                    assert_eq!(&answer[6..38], guids[0].as_bytes());
                    send(
                        &mut channel,
                        &[&header("TRF001", guids[1]), &header("TRF001", guids[2])],
                    )
                    .await;
                    for guid in &guids[1..] {
                        assert_eq!(&read_answer(&mut channel).await[6..38], guid.as_bytes());
                    }
                    ends_with_the_channel(channel, server, &in_flight).await;
                });
            });
            let text = handle.render();
            let count = text
                .lines()
                .find_map(|l| l.strip_prefix(crate::metric_names::ANSWERS_PAST_BUDGET))
                .map_or(0.0, |v| v.trim().parse::<f64>().unwrap());
            assert_eq!(count, want as f64, "budget {budget:?}:\n{text}");
        }
    }

    /// What a channel does in one step of [`a_lent_connection_answers_every_telegram_once_in_order`].
    #[derive(Debug, Clone, Copy)]
    enum Kind {
        Quick,
        Panics,
        Blocked,
        SlowCore,
    }

    impl Kind {
        fn tx(self) -> &'static str {
            match self {
                Kind::Quick => "TRF001",
                Kind::Panics => "PANIC1",
                Kind::Blocked => "BLOCK1",
                Kind::SlowCore => "SLOWDL",
            }
        }
        fn code(self) -> &'static [u8] {
            match self {
                Kind::Quick | Kind::Blocked => b"0000",
                Kind::Panics | Kind::SlowCore => b"E901",
            }
        }
    }

    fn kind() -> impl proptest::strategy::Strategy<Value = Kind> {
        use proptest::prelude::*;
        prop_oneof![
            6 => Just(Kind::Quick),
            2 => Just(Kind::Panics),
            2 => Just(Kind::Blocked),
            1 => Just(Kind::SlowCore),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: 12,
            ..proptest::prelude::ProptestConfig::default()
        })]

        /// Random batches of telegrams (one at a time, pipelined, split
        /// across writes; quick, panicking, blocked until released, or slower
        /// than their deadline) on one connection lent and taken back as they
        /// come: every telegram is answered exactly once, in order, with its
        /// own GUID and the code its kind gives, and nothing stays in flight.
        #[test]
        fn a_lent_connection_answers_every_telegram_once_in_order(
            batches in proptest::collection::vec(
                (proptest::collection::vec(kind(), 1..4), 0usize..200),
                1..7,
            ),
        ) {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let (hub, release, _call_thread) = scripted();
                let (mut channel, in_flight, server) = one_lent_connection(hub).await;
                let codec = FrameCodec::new(PrefixMode::Ascii, 4096);
                let mut n = 0u32;
                for (kinds, cut) in batches {
                    let mut sent = Vec::new();
                    let mut bytes = BytesMut::new();
                    for kind in kinds {
                        n += 1;
                        let guid = format!("20261129IBANK{n:019}");
                        codec.encode(&header(kind.tx(), &guid), &mut bytes).unwrap();
                        sent.push((kind, guid));
                    }
                    // In one write, or in two cut anywhere.
                    let cut = cut.min(bytes.len());
                    channel.write_all(&bytes[..cut]).await.unwrap();
                    channel.write_all(&bytes[cut..]).await.unwrap();
                    for (kind, _) in &sent {
                        if matches!(kind, Kind::Blocked) {
                            release.send(()).unwrap();
                        }
                    }
                    for (kind, guid) in &sent {
                        let answer = read_answer(&mut channel).await;
                        assert_eq!(&answer[..38], format!("{}{guid}", kind.tx()).as_bytes());
                        assert_eq!(&answer[60..64], kind.code(), "{kind:?} {guid}");
                    }
                }
                ends_with_the_channel(channel, server, &in_flight).await;
            });
        }
    }

    /// Counts GUIDs as handled as the hub counts a transfer's (from a
    /// deferred start, `waiting_to_start`, `no_longer_waiting`), for TRF001
    /// telegrams only (the hub counts every waiting telegram). A
    /// TRF001 is answered once the INQ001 behind it has looked; an INQ001
    /// answers 0000 when the GUID in its `orig` place (its own GUID with
    /// the first letter `T`) counts as handled as it first runs, else E904:
    /// what the hub's inquiry would make of a "never received".
    #[derive(Clone, Default)]
    struct Marks(Arc<MarksState>);

    #[derive(Default)]
    struct MarksState {
        handled: std::sync::Mutex<std::collections::HashMap<String, u32>>,
        looked: tokio::sync::Notify,
        trf_runs: tokio::sync::Notify,
    }

    impl std::ops::Deref for Marks {
        type Target = MarksState;
        fn deref(&self) -> &MarksState {
            &self.0
        }
    }

    impl MarksState {
        fn count(&self, echo: &Echo) -> bool {
            let transfer = echo.tx_code_str() == "TRF001";
            if transfer {
                let mut handled = self.handled.lock().unwrap();
                *handled.entry(echo.guid_str().to_string()).or_default() += 1;
            }
            transfer
        }
    }

    /// One count of a GUID in [`Marks`], until dropped.
    struct Counted(Marks, String);

    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.no_longer_waiting(&self.1);
        }
    }

    impl Answerer for Marks {
        /// A deferred TRF001 counts from its start to its end, as the hub
        /// counts one until it joins its flight, which counts it then.
        fn answer(
            self: Arc<Self>,
            telegram: Bytes,
            _peer: IpAddr,
            _cert: Option<Arc<ClientCert>>,
            _read_at: Instant,
            deferred: bool,
        ) -> impl Future<Output = (Echo, Reply)> + Send {
            let echo = Echo::from_telegram(&telegram);
            let counted = (deferred && self.count(&echo))
                .then(|| Counted((*self).clone(), echo.guid_str().to_string()));
            async move {
                let code = if echo.tx_code_str() == "TRF001" {
                    self.trf_runs.notify_one();
                    self.looked.notified().await;
                    Code::OK
                } else {
                    let orig = format!("T{}", &echo.guid_str()[1..]);
                    let handled = self.handled.lock().unwrap().contains_key(&orig);
                    self.looked.notify_one();
                    if handled {
                        Code::OK
                    } else {
                        Code::NEVER_RECEIVED
                    }
                };
                drop(counted);
                let reply = Reply {
                    code,
                    body: Vec::new(),
                    close: false,
                };
                (echo, reply)
            }
        }

        fn waiting_to_start(&self, echo: &Echo) -> bool {
            self.count(echo)
        }

        fn no_longer_waiting(&self, guid: &str) {
            let mut handled = self.handled.lock().unwrap();
            if let Some(n) = handled.get_mut(guid) {
                *n -= 1;
                if *n == 0 {
                    handled.remove(guid);
                }
            }
        }
    }

    /// A transfer and an inquiry about it pipelined behind it: the
    /// transfer's GUID counts as handled before the inquiry's task can run,
    /// whichever task the runtime runs first (before, only a transfer that
    /// waited for room was counted: the inquiry could run first, hear
    /// "never received" and answer E904, then the transfer was posted; a
    /// black-box probe saw it in about one pair of ten under load).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_transfer_counts_as_handled_before_the_inquiry_behind_it_runs() {
        let in_flight = Arc::new(InFlight::default());
        let limits = Limits::from(&ServerConfig::default());
        let (mut channel, _server) = served(Marks::default(), limits, None, in_flight).await;
        for i in 0..20 {
            let (trf, inq) = (format!("T{i:031}"), format!("I{i:031}"));
            let telegrams = [header("TRF001", &trf), header("INQ001", &inq)];
            send(&mut channel, &[&telegrams[0], &telegrams[1]]).await;
            for (sent, tx) in [(&trf, "TRF001"), (&inq, "INQ001")] {
                let answer = read_answer(&mut channel).await;
                assert_eq!(&answer[..38], format!("{tx}{sent}").as_bytes());
                assert_eq!(&answer[60..64], b"0000", "{tx} {sent}");
            }
        }
    }

    /// The same when the transfer came alone and is handled on the
    /// connection's own task, and the inquiry comes while it runs: the
    /// transfer moves to a task of its own, counted before the inquiry's
    /// starts.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_transfer_handled_inline_counts_before_the_inquiry_read_after_it() {
        let in_flight = Arc::new(InFlight::default());
        let limits = Limits::from(&ServerConfig::default());
        let marks = Marks::default();
        let (mut channel, _server) = served(marks.clone(), limits, None, in_flight).await;
        for i in 0..20 {
            let (trf, inq) = (format!("T{i:031}"), format!("I{i:031}"));
            let runs = marks.trf_runs.notified();
            send(&mut channel, &[&header("TRF001", &trf)]).await;
            runs.await;
            send(&mut channel, &[&header("INQ001", &inq)]).await;
            for (sent, tx) in [(&trf, "TRF001"), (&inq, "INQ001")] {
                let answer = read_answer(&mut channel).await;
                assert_eq!(&answer[..38], format!("{tx}{sent}").as_bytes());
                assert_eq!(&answer[60..64], b"0000", "{tx} {sent}");
            }
        }
    }

    /// A hub's handling of a telegram takes the drain as it was when the
    /// telegram started, in its connection's order, not when its task first
    /// runs: two transfers started before the drain are both tried (here
    /// against no core: E902), whichever task runs first, and one started
    /// after gets the drain's E903. Before, the drain was looked at as the
    /// task first ran: a transfer got E903 while the one pipelined behind
    /// it, whose task ran first, was posted (a black-box probe).
    #[tokio::test]
    async fn a_telegram_started_before_the_drain_is_answered_for_real() {
        let hub = Arc::new(crate::relay::test_hub("http://127.0.0.1:9".into()));
        let peer = IpAddr::from([127, 0, 0, 1]);
        let start = |guid: &str| {
            let telegram = crate::relay::test_transfer(guid, 10);
            handling(
                hub.clone(),
                telegram.into(),
                peer,
                None,
                Instant::now(),
                true,
            )
        };
        let first = start("20261205IBANK00000000000DRAIN001");
        let second = start("20261205IBANK00000000000DRAIN002");
        hub.start_draining();
        let after = start("20261205IBANK00000000000DRAIN003");
        for (handling, code) in [
            (second, Code::NOT_SENT),
            (first, Code::NOT_SENT),
            (after, Code::NO_CAPACITY),
        ] {
            let (echo, reply) = handling.await.unwrap();
            assert_eq!(reply.code, code, "{}", echo.guid_str());
        }
    }

    /// A transfer started (its task not run yet) counts as being posted: a
    /// telegram of the same GUID taken no further meanwhile, by the drain or
    /// by a budget that ran out before its turn, answers E901, not E903
    /// ("nothing sent"), since the started one will post when its task runs
    /// (before, E903 came, then the other was posted; found by a review).
    #[tokio::test]
    async fn a_guid_started_and_not_yet_run_is_not_answered_as_never_sent() {
        let peer = IpAddr::from([127, 0, 0, 1]);
        let start = |hub: &Arc<crate::relay::Hub>, guid: &str, read_at: Instant| {
            let telegram = crate::relay::test_transfer(guid, 10).into();
            handling(hub.clone(), telegram, peer, None, read_at, true)
        };
        let answer = async |handling: Handling| handling.await.unwrap().1.code;
        let late = Instant::now() - Duration::from_millis(1420);
        // A telegram taken no further, by its budget (it read long ago) or
        // by the drain, beside one started before it with time to run.
        for drained in [false, true] {
            let hub = Arc::new(crate::relay::test_hub("http://127.0.0.1:9".into()));
            let guid = format!("20261205IBANK0000000000PENDING0{}", u8::from(drained));
            let started = start(&hub, &guid, Instant::now());
            let read_at = if drained {
                hub.start_draining();
                Instant::now()
            } else {
                late
            };
            let beside = answer(start(&hub, &guid, read_at)).await;
            assert_eq!(beside, Code::UNKNOWN, "drained: {drained}");
            assert_eq!(
                answer(started).await,
                Code::NOT_SENT,
                "tried (no core here)"
            );
            // Alone now: nothing stays counted.
            assert_ne!(answer(start(&hub, &guid, read_at)).await, Code::UNKNOWN);
        }
    }

    /// A telegram is handled under the rules in force when it started, not
    /// those of a reload that came before its task first ran: a tx code
    /// the reload makes a transfer was not counted as being posted at its
    /// start, so an inquiry about its GUID could be told "never received"
    /// and the transfer posted after it (found by a review).
    #[tokio::test]
    async fn a_telegram_keeps_the_rules_it_started_under() {
        let peer = IpAddr::from([127, 0, 0, 1]);
        let hub = Arc::new(crate::relay::test_hub("http://127.0.0.1:9".into()));
        let rules_with = crate::relay::test_rules;
        use crate::config::Operation;
        let inquiry_only = [("INQ001", Operation::Inquiry)];
        let both = [
            ("TRF001", Operation::Transfer),
            ("INQ001", Operation::Inquiry),
        ];
        for (at_start, reloaded, code, journaled) in [
            (&inquiry_only[..], &both[..], Code::NOT_ROUTED, false),
            (&both[..], &inquiry_only[..], Code::NOT_SENT, true),
        ] {
            hub.set_rules(rules_with(at_start));
            let guid = format!("20261205IBANK0000000000000RULES{}", u8::from(journaled));
            let telegram = crate::relay::test_transfer(&guid, 10).into();
            let started = handling(hub.clone(), telegram, peer, None, Instant::now(), true);
            hub.set_rules(rules_with(reloaded));
            assert_eq!(started.await.unwrap().1.code, code, "{guid}");
            let row = hub.journal().get(&guid).await.unwrap();
            assert_eq!(row.is_some(), journaled, "{guid}");
        }
    }

    /// A telegram waiting for room counts as handled from its read until it
    /// starts, whatever its tx code (a reload may make it a transfer), and
    /// no longer once it has started: an INQ001 whose own GUID is the one
    /// it asks about, having waited behind a slow transfer, is not taken for
    /// a transfer of that GUID under way (E901) but gets the core's "never
    /// received" (E904).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiting_inquiry_no_longer_counts_once_it_starts() {
        use corebank::{FaultMethod, FaultRule};
        let (core, hub) = crate::relay::core_and_hub().await;
        let slow = "20261205IBANK0000000000000SLOW01";
        let asks = "20261205IBANK00000000000000ASKS1";
        core.add_fault(
            FaultRule::guid(slow)
                .method(FaultMethod::Post)
                .delay_ms(300),
        );
        let limits = Limits {
            max_in_flight_per_connection: 1,
            ..Limits::from(&ServerConfig::default())
        };
        let (mut channel, _server) = served(hub, limits, None, Arc::new(InFlight::default())).await;
        let fields = serde_json::json!({ "orig_guid": asks });
        let inquiry = crate::client::build_telegram(
            &crate::layout::builtin()["INQ001"],
            asks,
            "IBANK",
            "20261205120000",
            fields.as_object().unwrap(),
        )
        .unwrap();
        let transfer = crate::relay::test_transfer(slow, 10);
        send(&mut channel, &[&transfer, &inquiry]).await;
        for (guid, code) in [(slow, "0000"), (asks, "E904")] {
            let answer = read_answer(&mut channel).await;
            assert_eq!(&answer[6..38], guid.as_bytes());
            assert_eq!(&answer[60..64], code.as_bytes(), "{guid}");
        }
    }

    /// Whatever becomes of a connection's transfers (answered, started and
    /// cut off by the channel's close, waiting for room behind a small
    /// in-flight limit), none stays counted as handled or being posted once
    /// the connection and its telegrams' tasks have ended: a count left
    /// behind would turn every later "never received" about its GUID into
    /// E901.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_guid_stays_counted_once_its_connection_ends() {
        let hub = Arc::new(crate::relay::test_hub("http://127.0.0.1:9".into()));
        let limits = Limits {
            max_in_flight_per_connection: 2,
            ..Limits::from(&ServerConfig::default())
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let in_flight = Arc::new(InFlight::default());
        let server = tokio::spawn({
            let (hub, in_flight) = (hub.clone(), in_flight.clone());
            async move {
                let (stream, peer) = listener.accept().await.unwrap();
                serve_plain(stream, peer, hub, limits, in_flight, None, Carry::default()).await;
            }
        });
        let mut channel = TcpStream::connect(addr).await.unwrap();
        let guids: Vec<String> = (0..12)
            .map(|i| format!("20261205IBANK00000000000COUNT{i:03}"))
            .collect();
        // Every waiting telegram counts, whatever its tx code: transfers,
        // inquiries, a tx code with no route, a transfer whose body is cut.
        let telegrams: Vec<Vec<u8>> = guids
            .iter()
            .enumerate()
            .map(|(i, g)| match i % 4 {
                0 => crate::relay::test_transfer(g, 10),
                1 => {
                    let fields = serde_json::json!({ "orig_guid": guids[0] });
                    crate::client::build_telegram(
                        &crate::layout::builtin()["INQ001"],
                        g,
                        "IBANK",
                        "20261205120000",
                        fields.as_object().unwrap(),
                    )
                    .unwrap()
                }
                2 => header("TRF009", g),
                _ => header("TRF001", g),
            })
            .collect();
        send(
            &mut channel,
            &telegrams.iter().map(Vec::as_slice).collect::<Vec<_>>(),
        )
        .await;
        for _ in 0..3 {
            read_answer(&mut channel).await;
        }
        ends_with_the_channel(channel, server, &in_flight).await;
        // A telegram's task may outlive its connection (its answer has no
        // one to go to, its call goes on): counted until it ends, then no
        // longer. Polled, within a bound that a count left behind fails.
        let counted = || guids.iter().find(|g| hub.counts_as_handled(g));
        let cleared = tokio::time::timeout(Duration::from_secs(10), async {
            while counted().is_some() {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await;
        assert!(cleared.is_ok(), "{:?} is still counted", counted());
    }
}
