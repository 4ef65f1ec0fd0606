//! The TCP socket under every core call: ureq's own transport, less the
//! system calls that tell nothing on a healthy keep-alive connection.
//!
//! ureq's TCP transport, on every call:
//! * probes the pooled connection twice (when it goes back to the pool and
//!   when it is taken out again), each time switching the socket to
//!   non-blocking and back around a one-byte read: three system calls a
//!   probe;
//! * sets the socket's write timeout before it writes and its read timeout
//!   before it reads, whenever the time left differs from the last one set,
//!   which it always does, since the time left shrinks as the call goes on;
//! * writes a request's head and its body with a write each: two TCP
//!   segments, each sent (and, on the same machine, received) on its own,
//!   and a core that reads the head may wait again for the body.
//!
//! That was about 10 of the hub's 14 system calls per telegram. Here a probe is one
//! `recv` with `MSG_PEEK | MSG_DONTWAIT` (see [`crate::peek`]); the time
//! left is rounded down to [`TIMEOUT_STEP`] before it is compared, so a
//! socket's timeouts are set again only when its call's deadline moved by a
//! step (a read or write gives up at most one step before the deadline ureq
//! computed, never after it); and a head that announces a body is held back
//! and written with the body's first bytes, in one write. Holding it back
//! never makes "not sent" out of "may have been sent": the send gate above
//! has already counted the head as sent.
//!
//! Connecting is ureq's: each resolved address in turn, the connect timeout
//! shared between them in halving parts that add up to the whole (a single
//! address gets all of it; none less than 10 ms), moving on only when an
//! address refuses, is unreachable or times out.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use ureq::Timeout;
use ureq::unversioned::transport::time::Duration as UreqDuration;
use ureq::unversioned::transport::{
    Buffers, ConnectionDetails, Connector, Either, LazyBuffers, NextTimeout, ShutdownHandle,
    Transport,
};

use super::closes::CloseWatch;

/// The step a socket timeout is rounded down to.
pub(super) const TIMEOUT_STEP: Duration = Duration::from_millis(10);

/// The shortest connect attempt given to one of several addresses.
const MIN_PER_ADDRESS: Duration = Duration::from_millis(10);

/// Opens plain TCP connections as [`CoreSocket`]s, for one target.
#[derive(Debug, Clone)]
pub(super) struct SocketConnector {
    closes: Arc<CloseWatch>,
}

impl SocketConnector {
    pub(super) fn new(closes: Arc<CloseWatch>) -> SocketConnector {
        SocketConnector { closes }
    }
}

impl<In: Transport> Connector<In> for SocketConnector {
    type Out = Either<In, CoreSocket>;

    fn connect(
        &self,
        details: &ConnectionDetails,
        chained: Option<In>,
    ) -> Result<Option<Self::Out>, ureq::Error> {
        if chained.is_some() {
            return Ok(chained.map(Either::A));
        }
        let stream = connect_any(&details.addrs, details.timeout)?;
        stream.set_nodelay(true)?;
        let config = details.config;
        let buffers = LazyBuffers::new(config.input_buffer_size(), config.output_buffer_size());
        let stream = Arc::new(stream);
        // So that ureq can shut the socket down from another thread.
        let handle: Weak<dyn ShutdownHandle> = Arc::downgrade(&stream) as _;
        (details.register_shutdown)(handle)?;
        Ok(Some(Either::B(CoreSocket {
            stream,
            buffers,
            read_timeout: None,
            write_timeout: None,
            held: Vec::new(),
            answered: false,
            opened_at: Instant::now(),
            answers: 0,
            pooled_at: None,
            closes: self.closes.clone(),
            #[cfg(test)]
            writes: 0,
        })))
    }
}

/// Tries each address in turn within `timeout`.
fn connect_any(addrs: &[SocketAddr], timeout: NextTimeout) -> Result<TcpStream, ureq::Error> {
    let started = Instant::now();
    let total = timeout.not_zero().map(|t| *t);
    let mut last = None;
    for (i, addr) in addrs.iter().enumerate() {
        let per_address = total.map(|t| share(t, i, addrs.len()));
        let attempt = match per_address {
            Some(limit) => TcpStream::connect_timeout(addr, limit),
            None => TcpStream::connect(addr),
        };
        match attempt {
            Ok(stream) => return Ok(stream),
            Err(e) if timed_out(&e) => {
                // As ureq: with no time left at all, an address still gets a
                // short try, and the first that times out ends the connect.
                if !timeout.after.is_not_happening() && started.elapsed() >= *timeout.after {
                    return Err(ureq::Error::Timeout(timeout.reason));
                }
                last = Some(ureq::Error::Timeout(Timeout::Connect));
            }
            Err(e) if concerns_the_address(&e) => last = Some(ureq::Error::Io(e)),
            Err(e) => return Err(ureq::Error::Io(e)),
        }
    }
    Err(last.unwrap_or_else(|| {
        ureq::Error::Io(io::Error::new(
            io::ErrorKind::ConnectionRefused,
            "no address to connect to",
        ))
    }))
}

/// Address `i` of `n`'s share of `total`: 1/2, 1/4, ... of it, scaled so
/// that the shares add up to the whole.
fn share(total: Duration, i: usize, n: usize) -> Duration {
    let weights = 2.0 * (1.0 - 0.5_f64.powi(n as i32));
    let weight = 0.5_f64.powi(i as i32);
    total.mul_f64(weight / weights).max(MIN_PER_ADDRESS)
}

fn timed_out(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
    )
}

/// A failure that says nothing about the next address.
fn concerns_the_address(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::HostUnreachable
            | io::ErrorKind::NetworkUnreachable
            | io::ErrorKind::NetworkDown
            | io::ErrorKind::AddrNotAvailable
    )
}

/// A plain TCP connection to a core.
pub(super) struct CoreSocket {
    /// Shared (weakly) with ureq's shutdown handle.
    stream: Arc<TcpStream>,
    buffers: LazyBuffers,
    /// The timeouts the socket has now, as last set.
    read_timeout: Option<Duration>,
    write_timeout: Option<Duration>,
    /// A request's head, held back to go out with its body.
    held: Vec<u8>,
    /// The last read brought bytes: the call's answer, as far as this
    /// socket knows (see [`Transport::is_open`] below).
    answered: bool,
    /// When it was opened.
    opened_at: Instant,
    /// Answers it has brought (counted as it goes back to the pool).
    answers: u32,
    /// When it last went back to its pool, right after an answer.
    pooled_at: Option<Instant>,
    /// What the target's probes have found (see `closes.rs`).
    closes: Arc<CloseWatch>,
    /// Writes made, for the tests.
    #[cfg(test)]
    writes: usize,
}

impl CoreSocket {
    /// Tells the target's watch that the core closed this connection: found
    /// by the probe as a call took it out, or by a call that wrote into it
    /// and then read its end or a reset (the probe's race lost: the core's
    /// FIN came after the probe). Timed from when the connection went back
    /// to its pool; only one pooled after its first answer tells anything.
    fn note_core_close(&self) {
        if let (1, Some(at)) = (self.answers, self.pooled_at) {
            let now = Instant::now();
            self.closes
                .closed(self.opened_at, now.saturating_duration_since(at), now);
        }
    }
}

impl std::fmt::Debug for CoreSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoreSocket")
            .field("peer", &self.stream.peer_addr().ok())
            .finish()
    }
}

impl Transport for CoreSocket {
    fn buffers(&mut self) -> &mut dyn Buffers {
        &mut self.buffers
    }

    fn transmit_output(&mut self, amount: usize, timeout: NextTimeout) -> Result<(), ureq::Error> {
        let timeout = timeout.for_write();
        let limit = limit(timeout)?;
        if self.write_timeout != limit {
            self.stream.set_write_timeout(limit)?;
            self.write_timeout = limit;
        }
        let output = &self.buffers.output()[..amount];
        if self.held.is_empty() && announces_body(output) {
            self.held.extend_from_slice(output);
            return Ok(());
        }
        let whole = if self.held.is_empty() {
            output
        } else {
            self.held.extend_from_slice(output);
            &self.held
        };
        let written = (&*self.stream).write_all(whole);
        self.held.clear();
        #[cfg(test)]
        {
            self.writes += 1;
        }
        written.map_err(|e| io_error(e, timeout.reason))
    }

    fn await_input(&mut self, timeout: NextTimeout) -> Result<bool, ureq::Error> {
        if !self.held.is_empty() {
            // Not expected (the body follows its head straight away), but
            // never wait for an answer to a request not yet written. A
            // failure here is the write's, not a timeout of the wait (which
            // ureq may take as "go on"): the connection is done.
            self.transmit_output(0, timeout).map_err(|e| match e {
                ureq::Error::Timeout(_) => ureq::Error::Io(io::ErrorKind::TimedOut.into()),
                e => e,
            })?;
        }
        let timeout = timeout.for_read();
        let limit = limit(timeout)?;
        if self.read_timeout != limit {
            self.stream.set_read_timeout(limit)?;
            self.read_timeout = limit;
        }
        let started = Instant::now();
        let input = self.buffers.input_append_buf();
        let amount = loop {
            match (&*self.stream).read(input) {
                // Linux does not restart a socket read that has a timeout
                // after a signal: go on with what is left of it.
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                    // With no timeout, as ureq: the signal may have been
                    // meant to interrupt the read.
                    let Some(limit) = limit else {
                        return Err(ureq::Error::Io(e));
                    };
                    let left = limit.saturating_sub(started.elapsed());
                    if left.is_zero() {
                        return Err(ureq::Error::Timeout(timeout.reason));
                    }
                    self.stream.set_read_timeout(Some(left))?;
                    self.read_timeout = Some(left);
                }
                result => {
                    let kind = result.as_ref().map_err(io::Error::kind);
                    if matches!(kind, Ok(0) | Err(io::ErrorKind::ConnectionReset)) {
                        self.note_core_close();
                    }
                    break result.map_err(|e| io_error(e, timeout.reason))?;
                }
            }
        };
        self.buffers.input_appended(amount);
        self.answered = amount > 0;
        Ok(amount > 0)
    }

    /// Open: no byte waiting (the core sends nothing unasked), no end of
    /// stream or error, and no request head held back without its body.
    ///
    /// ureq asks twice per call: when the connection goes back to its pool,
    /// right after the answer was read, and when a later call takes it out.
    /// The first is answered without a system call: whatever that probe
    /// could find (bytes after the answer, the core's close) the second
    /// finds too, before anything is written, and the connection is then
    /// dropped as it would have been. Bytes past the answer that are already
    /// read, ureq finds in its buffer itself.
    ///
    /// The second probe also tells the target's [`CloseWatch`] of a
    /// connection the core closed right after answering; while the watch
    /// has reuse off, no pooled connection is reused (nor probed).
    fn is_open(&mut self) -> bool {
        if std::mem::take(&mut self.answered) {
            self.answers = self.answers.saturating_add(1);
            if self.answers > 1 {
                self.closes.kept();
            }
            self.pooled_at = Some(Instant::now());
            return self.held.is_empty();
        }
        if !self.held.is_empty() || !self.closes.reuse(Instant::now) {
            return false;
        }
        match crate::peek::peek_now(&self.stream) {
            crate::peek::Peeked::Nothing => true,
            crate::peek::Peeked::Bytes => false,
            crate::peek::Peeked::Closed => {
                self.note_core_close();
                false
            }
        }
    }
}

/// Whether `output` is a whole HTTP/1 request head whose body follows: it
/// ends the head and gives a content length other than zero (what ureq
/// writes for a request with a body of known size).
fn announces_body(output: &[u8]) -> bool {
    const LENGTH: &[u8] = b"\r\ncontent-length:";
    let Some(head) = output.strip_suffix(b"\r\n\r\n") else {
        return false;
    };
    let Some(at) = head
        .windows(LENGTH.len())
        .position(|w| w.eq_ignore_ascii_case(LENGTH))
    else {
        return false;
    };
    let value = &head[at + LENGTH.len()..];
    let value = &value[..value
        .windows(2)
        .position(|w| w == b"\r\n")
        .unwrap_or(value.len())];
    let digits = value.trim_ascii();
    !digits.is_empty() && digits.iter().all(u8::is_ascii_digit) && digits.iter().any(|&d| d != b'0')
}

/// The socket timeout for an exchange with `timeout` left: `None` for none,
/// rounded down to [`TIMEOUT_STEP`] when longer than a step.
fn limit(timeout: NextTimeout) -> Result<Option<Duration>, ureq::Error> {
    match timeout.after {
        UreqDuration::NotHappening => Ok(None),
        UreqDuration::Exact(d) if d.is_zero() => Err(ureq::Error::Timeout(timeout.reason)),
        UreqDuration::Exact(d) => Ok(Some(stepped(d))),
    }
}

/// `d` rounded down to a whole number of steps, if it is longer than one.
fn stepped(d: Duration) -> Duration {
    let step = TIMEOUT_STEP.as_nanos();
    let nanos = d.as_nanos();
    if nanos <= step {
        return d;
    }
    d - Duration::from_nanos((nanos % step) as u64)
}

/// A socket timeout as ureq reports it (by the deadline that set it).
fn io_error(e: io::Error, reason: Timeout) -> ureq::Error {
    if timed_out(&e) {
        ureq::Error::Timeout(reason)
    } else {
        ureq::Error::Io(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn after(d: Duration) -> NextTimeout {
        NextTimeout {
            after: UreqDuration::Exact(d),
            reason: Timeout::Global,
            per_read: None,
            per_write: None,
        }
    }

    #[test]
    fn the_time_left_is_rounded_down_to_a_step_never_up() {
        let ms = Duration::from_millis;
        assert_eq!(stepped(ms(2_999) + Duration::from_micros(870)), ms(2_990));
        assert_eq!(stepped(ms(2_990)), ms(2_990));
        assert_eq!(stepped(ms(11)), ms(10));
        // A step or less stays as it is: rounding would make it none.
        assert_eq!(stepped(ms(10)), ms(10));
        assert_eq!(
            stepped(Duration::from_micros(300)),
            Duration::from_micros(300)
        );
        let longest = Duration::MAX;
        assert!(stepped(longest) <= longest && stepped(longest) > longest - TIMEOUT_STEP);
        for micros in [1u64, 999, 10_001, 123_456_789] {
            let d = Duration::from_micros(micros);
            assert!(stepped(d) <= d && !stepped(d).is_zero());
        }
        assert_eq!(limit(NextTimeout::default()).unwrap(), None);
        assert!(matches!(
            limit(after(Duration::ZERO)),
            Err(ureq::Error::Timeout(Timeout::Global))
        ));
    }

    #[test]
    fn the_shares_of_the_connect_timeout_add_up_to_it() {
        let total = Duration::from_millis(1_600);
        assert_eq!(share(total, 0, 1), total);
        let shares: Vec<Duration> = (0..4).map(|i| share(total, i, 4)).collect();
        assert!(shares.windows(2).all(|w| w[0] > w[1]));
        let sum: Duration = shares.iter().sum();
        assert!(sum.abs_diff(total) < Duration::from_millis(1), "{sum:?}");
        assert_eq!(share(total, 30, 31), MIN_PER_ADDRESS);
    }

    /// A connected pair: the hub's socket, the core's end.
    fn pair() -> (CoreSocket, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let stream = connect_any(&[addr], after(Duration::from_secs(5))).unwrap();
        let (core, _) = listener.accept().unwrap();
        let socket = CoreSocket {
            stream: Arc::new(stream),
            buffers: LazyBuffers::new(1024, 1024),
            read_timeout: None,
            write_timeout: None,
            held: Vec::new(),
            answered: false,
            opened_at: Instant::now(),
            answers: 0,
            pooled_at: None,
            closes: Arc::new(CloseWatch::new("test")),
            writes: 0,
        };
        (socket, core)
    }

    #[test]
    fn a_connection_is_open_until_the_core_sends_unasked_or_closes() {
        let (mut socket, mut core) = pair();
        assert!(socket.is_open());
        assert!(socket.is_open(), "a probe leaves the socket as it was");
        core.write_all(b"x").unwrap();
        // Blocks until the byte is here (and leaves it).
        socket.stream.peek(&mut [0u8; 1]).unwrap();
        assert!(!socket.is_open(), "a byte nobody asked for");

        let (mut socket, core) = pair();
        drop(core);
        // Blocks until the end of the stream is here.
        assert_eq!(socket.stream.peek(&mut [0u8; 1]).unwrap(), 0);
        assert!(!socket.is_open(), "closed by the core");
    }

    /// The probe as the connection goes back to the pool, right after its
    /// answer, is skipped; the one as a call takes it out sees what it
    /// would have seen.
    #[test]
    fn a_connection_is_probed_when_taken_out_not_when_put_back() {
        let (mut socket, mut core) = pair();
        let left = after(Duration::from_secs(5));
        core.write_all(b"HTTP/1.1 200 OK\r\n\r\n").unwrap();
        assert!(socket.await_input(left).unwrap());
        core.write_all(b"x").unwrap();
        // Blocks until the unasked byte is here (and leaves it).
        socket.stream.peek(&mut [0u8; 1]).unwrap();
        assert!(socket.is_open(), "put back after its answer: no probe");
        assert!(!socket.is_open(), "taken out: the probe sees the byte");

        let (mut socket, mut core) = pair();
        core.write_all(b"HTTP/1.1 200 OK\r\n\r\n").unwrap();
        assert!(socket.await_input(left).unwrap());
        drop(core);
        assert_eq!(socket.stream.peek(&mut [0u8; 1]).unwrap(), 0);
        assert!(socket.is_open());
        assert!(!socket.is_open(), "taken out: the probe sees the close");
        assert!(!socket.await_input(left).unwrap(), "the end of the stream");
        assert!(
            !socket.is_open(),
            "a read that brought nothing is no answer"
        );
    }

    #[test]
    fn a_socket_timeout_is_set_again_only_when_the_deadline_moved_a_step() {
        let (mut socket, mut core) = pair();
        let left = Duration::from_millis(2_999);
        socket.buffers.output()[..1].copy_from_slice(b"a");
        socket.transmit_output(1, after(left)).unwrap();
        let first = socket.write_timeout;
        assert_eq!(first, Some(Duration::from_millis(2_990)));
        // What the socket has (the kernel keeps it in its own ticks).
        let kernels = socket.stream.write_timeout().unwrap();
        assert!(kernels.is_some());
        socket
            .transmit_output(1, after(left - Duration::from_micros(400)))
            .unwrap();
        assert_eq!(socket.write_timeout, first);
        assert_eq!(socket.stream.write_timeout().unwrap(), kernels);
        socket
            .transmit_output(1, after(left - Duration::from_millis(10)))
            .unwrap();
        assert_eq!(socket.write_timeout, Some(Duration::from_millis(2_980)));

        let mut written = [0u8; 3];
        core.read_exact(&mut written).unwrap();
        assert_eq!(&written, b"aaa");
        core.write_all(b"HTTP").unwrap();
        assert!(socket.await_input(after(left)).unwrap());
        assert_eq!(socket.read_timeout, Some(Duration::from_millis(2_990)));
        assert_eq!(socket.buffers.input(), b"HTTP");
    }

    #[test]
    fn only_a_head_that_announces_a_body_waits_for_it() {
        let post = b"POST /v1/transfers HTTP/1.1\r\nhost: core\r\ncontent-length: 166\r\n\r\n";
        assert!(announces_body(post));
        assert!(announces_body(
            b"POST / HTTP/1.1\r\nContent-Length:7\r\n\r\n"
        ));
        for no in [
            &b"GET /v1/transfers/G1 HTTP/1.1\r\nhost: core\r\n\r\n"[..],
            b"POST / HTTP/1.1\r\ncontent-length: 0\r\n\r\n",
            b"POST / HTTP/1.1\r\ncontent-length: 00\r\n\r\n",
            // Not the end of the head: more of it follows.
            b"POST / HTTP/1.1\r\ncontent-length: 5\r\n",
            b"POST / HTTP/1.1\r\ncontent-length: x\r\n\r\n",
            b"POST / HTTP/1.1\r\nx-content-length: 5\r\n\r\n",
            b"{\"amount\":1}",
            b"",
        ] {
            assert!(!announces_body(no), "{}", String::from_utf8_lossy(no));
        }
    }

    /// The head and the body reach the core in one read; a request without
    /// a body goes out at once.
    #[test]
    fn a_head_goes_out_with_its_body_in_one_write() {
        let (mut socket, mut core) = pair();
        // A failure here is a broken test, not a hang.
        core.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let left = after(Duration::from_secs(5));
        let head = b"POST / HTTP/1.1\r\ncontent-length: 2\r\n\r\n";
        socket.buffers.output()[..head.len()].copy_from_slice(head);
        socket.transmit_output(head.len(), left).unwrap();
        assert_eq!(crate::peek::peek_now(&core), crate::peek::Peeked::Nothing);
        assert!(!socket.is_open(), "a request half written is never reused");
        socket.buffers.output()[..2].copy_from_slice(b"{}");
        socket.transmit_output(2, left).unwrap();
        assert_eq!(socket.writes, 1, "the head and the body in one write");
        let mut got = vec![0u8; 64];
        let n = core.read(&mut got).unwrap();
        assert_eq!(&got[..n], b"POST / HTTP/1.1\r\ncontent-length: 2\r\n\r\n{}");

        let get = b"GET / HTTP/1.1\r\n\r\n";
        socket.buffers.output()[..get.len()].copy_from_slice(get);
        socket.transmit_output(get.len(), left).unwrap();
        assert_eq!(socket.writes, 2, "a head without a body at once");
        let n = core.read(&mut got).unwrap();
        assert_eq!(&got[..n], get);

        // Held, then an answer awaited: the head goes out first.
        socket.buffers.output()[..head.len()].copy_from_slice(head);
        socket.transmit_output(head.len(), left).unwrap();
        core.write_all(b"H").unwrap();
        assert!(socket.await_input(left).unwrap());
        let n = core.read(&mut got).unwrap();
        assert_eq!(&got[..n], head);
    }

    #[test]
    fn a_read_past_its_time_is_a_timeout_of_the_deadline_that_set_it() {
        let (mut socket, _core) = pair();
        let mut short = after(Duration::from_millis(30));
        short.reason = Timeout::RecvResponse;
        let started = Instant::now();
        let err = socket.await_input(short).unwrap_err();
        assert!(
            matches!(err, ureq::Error::Timeout(Timeout::RecvResponse)),
            "{err:?}"
        );
        assert!(started.elapsed() >= Duration::from_millis(30));
    }

    /// A core that answers each connection's first request and closes it,
    /// without `Connection: close`; `closed` runs after each close. Its URL.
    fn closing_core(closed: impl Fn() + Send + 'static) -> String {
        use std::io::{BufRead, BufReader};
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                while reader.read_line(&mut line).unwrap_or(0) > 0 && line != "\r\n" {
                    line.clear();
                }
                let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}");
                drop((reader, stream));
                closed();
            }
        });
        url
    }

    /// An agent on these sockets that pools one idle connection.
    fn pooling_agent(watch: Arc<CloseWatch>) -> ureq::Agent {
        let config = ureq::Agent::config_builder()
            .proxy(None)
            .max_idle_connections(1)
            .build();
        ureq::Agent::with_parts(
            config,
            ().chain(SocketConnector::new(watch)),
            ureq::unversioned::resolver::DefaultResolver::default(),
        )
    }

    /// Through ureq's pool: a core that closes each connection after its
    /// answer (without saying so) costs a new connection per call, never a
    /// request written into a closed one.
    #[test]
    fn a_pooled_connection_the_core_closed_is_not_reused() {
        let (closed, closes) = std::sync::mpsc::channel();
        let url = closing_core(move || {
            let _ = closed.send(());
        });
        let agent = pooling_agent(Arc::new(CloseWatch::new("test")));
        for call in 0..3 {
            let mut answer = agent
                .get(&url)
                .call()
                .unwrap_or_else(|e| panic!("call {call}: {e}"));
            assert_eq!(answer.body_mut().read_to_string().unwrap(), "{}");
            // The core's end is closed (its FIN sent) before the next call.
            closes.recv().unwrap();
        }
    }

    /// A core that closes every connection right after its answer, without
    /// `Connection: close`, as fast as it can: its FIN races the probe of
    /// the next call, and a call that loses writes into a closed connection
    /// ("don't know"). After a few such closes the target stops reusing its
    /// connections, so only the calls before that can lose.
    #[test]
    fn a_core_that_closes_after_every_answer_stops_reuse() {
        const CALLS: usize = 400;
        let url = closing_core(|| {});
        let watch = Arc::new(CloseWatch::new("test"));
        let agent = pooling_agent(watch.clone());
        let failed = (0..CALLS)
            .filter(|_| {
                agent
                    .get(&url)
                    .call()
                    .and_then(|mut a| a.body_mut().read_to_string())
                    .is_err()
            })
            .count();
        assert!(!watch.reuse(Instant::now), "reuse is still on");
        assert!(
            failed < super::super::closes::SEEN as usize,
            "{failed} of {CALLS} calls failed"
        );
    }

    #[test]
    fn a_refused_address_moves_on_to_the_next() {
        // A port held by a connected socket, which does not listen: a connect
        // to it is refused, and no other socket can take it meanwhile.
        let (held, _core) = pair();
        let closed = held.stream.local_addr().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let open = listener.local_addr().unwrap();
        let stream = connect_any(&[closed, open], after(Duration::from_secs(5))).unwrap();
        assert_eq!(stream.peer_addr().unwrap(), open);
        let err = connect_any(&[closed], after(Duration::from_secs(5))).unwrap_err();
        assert!(
            matches!(&err, ureq::Error::Io(e) if e.kind() == io::ErrorKind::ConnectionRefused),
            "{err:?}"
        );
    }
}
