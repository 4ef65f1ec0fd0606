//! The admin listener's bounds: how many connections it holds at once, and
//! how long one may sit without a byte either way.
//!
//! The admin port shares the process's file descriptors with the telegram
//! listener. Unbounded, idle or half-sent admin connections (a scraper that
//! never closes, a port scanner) could use them all up, and channels' new
//! connections would then wait on `EMFILE`. So a connection past
//! [`MAX_ADMIN_CONNECTIONS`] waits in the kernel's backlog until one closes,
//! and one idle for [`ADMIN_IDLE`] after an answer, or whose request does not
//! arrive whole within a third of that (from the accept, or from its first
//! bytes), is closed, unless a request of it is being answered ([`Busy`]: a
//! reconcile of many rows may take longer, and closing the connection would
//! cut it short). Bytes read do not restart the clock: a request sent a byte
//! at a time is closed like an idle connection.
//!
//! When the process is out of descriptors all the same (channels, core
//! connections), [`RESERVED_ADMIN_CONNECTIONS`] admin connections still get
//! in, each on a descriptor kept in reserve for it: `/metrics` and `/readyz`
//! answer when an operator most needs them.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

use crate::reserve_descriptors::{FromReserve, Held, Reserve, is_out_of_descriptors};

/// Admin connections open at once, at most: scrapers, probes and a few
/// consoles need a handful.
pub const MAX_ADMIN_CONNECTIONS: usize = 64;

/// An admin connection idle this long is closed: nothing written to it, and
/// no request begun, for this long (an idle keep-alive, a request that
/// stopped half-way or trickles, a reader that stopped reading).
pub const ADMIN_IDLE: Duration = Duration::from_secs(30);

/// How long a request may take to arrive whole, from its first bytes (or
/// from the connection's accept): a third of the idle time, 10 s for the
/// listener's; the idle time is the wait for the next request on a kept-alive
/// connection.
fn request_time(idle: Duration) -> Duration {
    idle / 3
}

/// Admin connections served at the open-file limit, at most: a scrape and a
/// probe at once. Each holds a descriptor kept in reserve for it.
pub const RESERVED_ADMIN_CONNECTIONS: usize = 2;

/// Tries of the reserve before the admin listener waits a second.
const RESERVE_TRIES: usize = 3;

/// A TCP listener that hands out at most `limit` connections at once, each
/// closed after `idle` without progress.
pub struct AdminListener {
    inner: TcpListener,
    slots: Arc<Semaphore>,
    idle: Duration,
    /// At the open-file limit, the connections that still get in.
    reserve: Reserve,
}

impl AdminListener {
    pub fn new(inner: TcpListener, limit: usize, idle: Duration) -> AdminListener {
        AdminListener {
            inner,
            slots: Arc::new(Semaphore::new(limit.max(1))),
            idle,
            reserve: Reserve::new(RESERVED_ADMIN_CONNECTIONS),
        }
    }
}

impl axum::serve::Listener for AdminListener {
    type Io = AdminStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (AdminStream, SocketAddr) {
        // A slot first: past the limit, connections stay in the backlog and
        // take no descriptor of the process.
        // The semaphore is never closed, so a slot always comes.
        let slot = self.slots.clone().acquire_owned().await.ok();
        let (stream, addr, reserved) = loop {
            let e = match self.inner.accept().await {
                Ok((stream, addr)) => {
                    self.reserve.top_up();
                    break (stream, addr, None);
                }
                Err(e) => e,
            };
            if is_out_of_descriptors(&e) {
                // A few tries: the descriptor freed for the accept can be
                // taken by another thread first, and come free again soon.
                let mut taken = FromReserve::Failed;
                for _ in 0..RESERVE_TRIES {
                    taken = self.reserve.accept(&self.inner).await;
                    if !matches!(taken, FromReserve::Failed) {
                        break;
                    }
                    tokio::task::yield_now().await;
                }
                match taken {
                    FromReserve::Accepted(stream, addr, held) => break (stream, addr, Some(held)),
                    FromReserve::NoneWaiting => continue,
                    FromReserve::Failed => {}
                }
            }
            // As axum does for a listener: a connection's own trouble is
            // its own; anything else is logged and retried in a second.
            if !matches!(
                e.kind(),
                io::ErrorKind::ConnectionRefused
                    | io::ErrorKind::ConnectionAborted
                    | io::ErrorKind::ConnectionReset
            ) {
                tracing::warn!(%e, "admin listener: accept failed; retrying in 1 s");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        };
        let _ = stream.set_nodelay(true);
        (AdminStream::new(stream, slot, reserved, self.idle), addr)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// An accepted admin connection: holds its slot, and fails its reads and
/// writes once it has made no progress for the idle time (hyper then closes
/// it).
pub struct AdminStream {
    stream: TcpStream,
    /// The reserved descriptor the connection took at the open-file limit:
    /// after `stream`, so that it is opened again once the stream's
    /// descriptor is free.
    _reserved: Option<Held>,
    _slot: Option<OwnedSemaphorePermit>,
    idle: Duration,
    deadline: Pin<Box<Sleep>>,
    busy: Busy,
    /// Nothing read since the connection was accepted or last written to:
    /// the first bytes of a request start its idle time again, once.
    fresh: bool,
}

/// Requests of one admin connection being answered now: a connection that
/// has one is not idle, however long its handler takes. Each request's
/// `ConnectInfo` (see `admin::serve`).
#[derive(Clone, Default)]
pub struct Busy(Arc<AtomicUsize>);

impl Busy {
    /// Marks a request as being answered until the guard is dropped.
    pub fn enter(&self) -> impl Drop + use<> {
        struct Leave(Arc<AtomicUsize>);
        impl Drop for Leave {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        self.0.fetch_add(1, Ordering::AcqRel);
        Leave(self.0.clone())
    }

    fn any(&self) -> bool {
        self.0.load(Ordering::Acquire) > 0
    }
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, AdminListener>>
    for Busy
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, AdminListener>) -> Busy {
        stream.io().busy.clone()
    }
}

impl AdminStream {
    fn new(
        stream: TcpStream,
        slot: Option<OwnedSemaphorePermit>,
        reserved: Option<Held>,
        idle: Duration,
    ) -> AdminStream {
        AdminStream {
            stream,
            _reserved: reserved,
            _slot: slot,
            idle,
            // A new connection's request is due at once.
            deadline: Box::pin(tokio::time::sleep(request_time(idle))),
            busy: Busy::default(),
            fresh: true,
        }
    }

    /// What a pending read or write returns: an error once idle too long.
    fn waiting<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        if self.busy.any() {
            // Answering: the idle time starts again. The timer is polled, so
            // it holds this waker: once the answer is out it wakes the task
            // again (hyper's read is already pending by then).
            self.restart();
            let _ = self.deadline.as_mut().poll(cx);
            return Poll::Pending;
        }
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("admin connection idle for {:?}", self.idle),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }

    /// The idle time starts again now.
    fn restart(&mut self) {
        let next = Instant::now() + self.idle;
        self.deadline.as_mut().reset(next);
    }

    /// A write's result: progress restarts the idle time, and the next
    /// request's first bytes will again.
    fn after<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match polled {
            Poll::Ready(r) => {
                self.restart();
                self.fresh = true;
                Poll::Ready(r)
            }
            Poll::Pending => self.waiting(cx),
        }
    }
}

impl AsyncRead for AdminStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // Only a request's first bytes restart the clock, and then for a
        // third of the idle time: a request sent a byte at a time would
        // otherwise hold its slot for as long as it likes (64 of them
        // starved /healthz and /metrics; found by a black-box probe). The
        // idle time starts again once it is answered.
        let filled = buf.filled().len();
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if this.fresh && buf.filled().len() > filled {
                    this.fresh = false;
                    let next = Instant::now() + request_time(this.idle);
                    this.deadline.as_mut().reset(next);
                }
                Poll::Ready(r)
            }
            Poll::Pending => this.waiting(cx),
        }
    }
}

impl AsyncWrite for AdminStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write(cx, buf);
        this.after(cx, polled)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.stream).poll_flush(cx) {
            Poll::Pending => this.waiting(cx),
            ready => ready,
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        this.after(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// Middleware for the admin router: marks the connection busy while a
/// request of it is answered.
pub async fn answering(
    axum::extract::ConnectInfo(busy): axum::extract::ConnectInfo<Busy>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let _answering = busy.enter();
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn served(limit: usize, idle: Duration) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new()
            .route("/healthz", axum::routing::get(|| async { "ok\n" }))
            .route(
                "/slow",
                axum::routing::get(|| async {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    "done\n"
                }),
            )
            .layer(axum::middleware::from_fn(answering));
        tokio::spawn(async move {
            axum::serve(
                AdminListener::new(listener, limit, idle),
                app.into_make_service_with_connect_info::<Busy>(),
            )
            .await
            .unwrap();
        });
        addr
    }

    async fn health(addr: SocketAddr) -> String {
        get(addr, "/healthz").await
    }

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let head = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        s.write_all(head.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn an_idle_connection_is_closed_and_frees_its_slot() {
        let addr = served(1, Duration::from_millis(300)).await;
        // Holds the only slot: half a request, then nothing.
        let mut idle = TcpStream::connect(addr).await.unwrap();
        idle.write_all(b"GET /heal").await.unwrap();
        // The next connection waits in the backlog for the slot, which the
        // idle one gives up when it is closed, then is served.
        let answer = tokio::time::timeout(Duration::from_secs(10), health(addr))
            .await
            .expect("served once the idle connection is closed");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        let mut rest = Vec::new();
        let n = idle.read_to_end(&mut rest).await.unwrap_or(0);
        assert_eq!(n, 0, "closed without an answer: {rest:?}");
    }

    /// A handler that takes longer than the idle time is answered: the
    /// connection is busy, not idle.
    #[tokio::test]
    async fn a_request_answered_slower_than_the_idle_time_is_answered() {
        let addr = served(4, Duration::from_millis(200)).await;
        let answer = tokio::time::timeout(Duration::from_secs(10), get(addr, "/slow"))
            .await
            .expect("answered");
        assert!(
            answer.starts_with("HTTP/1.1 200") && answer.ends_with("done\n"),
            "{answer}"
        );
    }

    /// A keep-alive connection that goes quiet after a slow answer is still
    /// closed once idle (the timer's waker was spent during the answer).
    #[tokio::test]
    async fn a_keep_alive_connection_quiet_after_a_slow_answer_is_closed() {
        let addr = served(4, Duration::from_millis(300)).await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut seen = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(10), async {
            let mut buf = [0u8; 512];
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => seen.extend_from_slice(&buf[..n]),
                }
            }
        })
        .await;
        let text = String::from_utf8_lossy(&seen).to_string();
        assert!(text.ends_with("done\n"), "answered first: {text}");
        assert!(closed.is_ok(), "still open 10 s after the answer");
    }

    /// A request sent a byte at a time, each byte within the idle time, is
    /// closed once the idle time has passed with nothing answered: it does
    /// not hold its slot for as long as it trickles.
    #[tokio::test]
    async fn a_request_trickled_a_byte_at_a_time_is_closed() {
        let idle = Duration::from_millis(300);
        let addr = served(1, idle).await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        let closed = tokio::time::timeout(Duration::from_secs(10), async {
            for byte in b"GET /healthz HTTP/1.1\r\nX-Slow: "
                .iter()
                .chain([b'a'; 200].iter())
            {
                if s.write_all(&[*byte]).await.is_err() {
                    return;
                }
                // Pacing the sender well inside the idle time.
                tokio::time::sleep(idle / 3).await;
            }
        })
        .await;
        assert!(closed.is_ok(), "still open after 10 s of trickling");
        let mut rest = Vec::new();
        let n = s.read_to_end(&mut rest).await.unwrap_or(0);
        assert_eq!(n, 0, "closed without an answer: {rest:?}");
    }

    /// A connection that sends nothing after its accept is closed once a
    /// request's time has passed, well before the idle time.
    #[tokio::test]
    async fn a_connection_that_sends_nothing_is_closed_at_the_request_time() {
        let idle = Duration::from_secs(3);
        let addr = served(1, idle).await;
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let started = std::time::Instant::now();
        let mut rest = Vec::new();
        let n = tokio::time::timeout(idle, silent.read_to_end(&mut rest))
            .await
            .expect("closed before the idle time")
            .unwrap_or(0);
        assert_eq!(n, 0, "closed without an answer");
        assert!(started.elapsed() < idle / 2, "{:?}", started.elapsed());
    }

    /// A keep-alive request begun just before the idle time runs out has
    /// the whole idle time from its first bytes: it is answered.
    #[tokio::test]
    async fn a_request_begun_late_in_the_idle_time_is_answered() {
        let idle = Duration::from_secs(3);
        let addr = served(1, idle).await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        let mut buf = [0u8; 512];
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let n = s.read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
        // Nine tenths of the idle time after the answer, half a request; the
        // rest a sixth of the idle time later (within the third a request
        // has), past the answer's idle time.
        tokio::time::sleep(idle * 9 / 10).await;
        s.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
        tokio::time::sleep(idle / 6).await;
        s.write_all(b"Host: x\r\n\r\n").await.unwrap();
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .expect("an answer or a close")
            .unwrap_or(0);
        let text = String::from_utf8_lossy(&buf[..n]);
        assert!(text.starts_with("HTTP/1.1 200"), "answered: {text:?}");
    }

    #[tokio::test]
    async fn connections_under_the_limit_are_served_at_once() {
        let addr = served(4, Duration::from_secs(30)).await;
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(TcpStream::connect(addr).await.unwrap());
        }
        let answer = tokio::time::timeout(Duration::from_secs(10), health(addr))
            .await
            .expect("a fourth connection is served while three are open");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
}
