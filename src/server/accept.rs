//! Taking connections in: the listeners, the accept loop (with its answers
//! to a full connection table and to the open-file limit), a connection's
//! task with its TLS handshake, and the drain that ends them.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::{Instrument, debug, info, info_span, warn};

use super::adoption::{Adopters, Carry};
use super::{Answerer, CLOSE_GRACE, InFlight, Limits, TlsStream, serve_connection, serve_plain};
use crate::channel_tls::{self, Acceptor};
use crate::relay::Hub;
use crate::reserve_descriptors::{self, FromReserve, Reserve};
use crate::rules::ClientCert;
use crate::throttle::Throttle;

/// The TLS listener and the configuration its next handshake uses.
pub struct TlsListener {
    pub listener: TcpListener,
    pub acceptor: Arc<Acceptor>,
}

/// Binds a listener with a backlog deep enough for a burst of channel connects
/// (a short one turns a burst into refused connects: false E902s upstream).
pub fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    listen(reserve(addr)?)
}

/// Binds a socket without listening on it: an address held by a running
/// listener is refused now, before a start creates anything (a journal
/// file), while a channel's connect is still refused at once, not left in a
/// backlog nobody reads, until [`listen`].
pub fn reserve(addr: SocketAddr) -> std::io::Result<TcpSocket> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    Ok(socket)
}

/// Listens on a socket [`reserve`] bound.
pub fn listen(socket: TcpSocket) -> std::io::Result<TcpListener> {
    socket.listen(4096)
}

/// Serves telegrams on `listener` (and on `tls`, when given) until `shutdown`
/// resolves, then drains: stops accepting, answers E903 to new telegrams
/// (a transfer whose GUID the journal holds: what its row says), lets
/// in-flight ones finish, returns.
pub async fn run(
    listener: TcpListener,
    tls: Option<TlsListener>,
    hub: Arc<Hub>,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) {
    let mut serving = Serving {
        in_flight: Arc::new(InFlight::default()),
        adopters: Arc::new(Adopters::new()),
        slots: Arc::new(Semaphore::new(limits.max_connections)),
        hub,
        limits,
        full: Throttle::new(ACCEPT_FAILURE_LINE_EVERY),
    };
    let mut connections = JoinSet::new();
    let mut accept_failures = Throttle::new(ACCEPT_FAILURE_LINE_EVERY);
    let mut turned_away = Throttle::new(ACCEPT_FAILURE_LINE_EVERY);
    // One descriptor, to turn a channel away at the open-file limit.
    let spare = Reserve::new(1);
    tokio::pin!(shutdown);
    loop {
        let accept_tls = async {
            match &tls {
                Some(t) => t.listener.accept().await,
                None => std::future::pending().await,
            }
        };
        let (accepted, is_tls) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => (accepted, false),
            accepted = accept_tls => (accepted, true),
            Some(_) = connections.join_next(), if !connections.is_empty() => {
                spare.top_up();
                continue;
            }
        };
        let (stream, peer) = match accepted {
            Ok(x) => {
                spare.top_up();
                x
            }
            Err(e) => {
                let on = match (&tls, is_tls) {
                    (Some(t), true) => &t.listener,
                    _ => &listener,
                };
                let taken = if reserve_descriptors::is_out_of_descriptors(&e) {
                    spare.accept(on).await
                } else {
                    FromReserve::Failed
                };
                if let FromReserve::NoneWaiting = taken {
                    continue;
                }
                if let FromReserve::Accepted(stream, _, held) = taken {
                    // Closed at once, then the reserve opened again in its
                    // descriptor.
                    drop(stream);
                    drop(held);
                    metrics::counter!(crate::metric_names::CONNECTIONS_REFUSED).increment(1);
                    if let Some(connections) = turned_away.note(Instant::now()) {
                        warn!(
                            %e,
                            connections,
                            "connection refused: out of file descriptors (raise the open-file limit); \
                             `connections` counts those closed at once since the last such line"
                        );
                    }
                    continue;
                }
                // Out of file descriptors with no reserve, and the like: back
                // off, keep serving. Retried every 50 ms while it lasts: one
                // line per ACCEPT_FAILURE_LINE_EVERY, with the count since the last.
                if let Some(failures) = accept_failures.note(Instant::now()) {
                    tracing::error!(
                        %e,
                        failures,
                        "accept failed; new channel connections wait in the backlog \
                         (retried every 50 ms; `failures` counts them since the last such line)"
                    );
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // The configuration in force now: a reload changes the next one only.
        let acceptor = match (&tls, is_tls) {
            (Some(t), true) => Some(t.acceptor.current()),
            _ => None,
        };
        serving.spawn(&mut connections, stream, peer, acceptor, false);
    }
    serving.hub.start_draining();
    // Connections the kernel completed and the loop had not taken yet are
    // open to their channels, some with a telegram sent: taken in now (as
    // many as there are free connection slots), they get E903 like any open
    // connection, instead of the reset that closing the listener with them
    // in its backlog would give. Taken after the drain began: none of their
    // telegrams is handled as if the hub were not draining.
    for (stream, peer) in backlog(listener, serving.slots.available_permits()) {
        serving.spawn(&mut connections, stream, peer, None, true);
    }
    if let Some(t) = tls {
        let acceptor = t.acceptor.current();
        for (stream, peer) in backlog(t.listener, serving.slots.available_permits()) {
            serving.spawn(&mut connections, stream, peer, Some(acceptor.clone()), true);
        }
    }
    info!("draining: listeners closed, waiting for telegrams in flight");
    let in_flight = &serving.in_flight;
    in_flight.wait_idle().await;
    // Idle connections close; one that receives a telegram meanwhile
    // answers it (E903) first.
    in_flight.close_idle();
    let closed = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(CLOSE_GRACE, closed).await.is_err() {
        info!(
            connections = connections.len(),
            "closing connections still reading part of a telegram"
        );
    }
    connections.shutdown().await;
    info!("drained");
}

/// How often the accept loop logs a failure that keeps coming back.
const ACCEPT_FAILURE_LINE_EVERY: Duration = Duration::from_secs(10);

/// What every accepted connection's task shares.
struct Serving {
    hub: Arc<Hub>,
    limits: Limits,
    in_flight: Arc<InFlight>,
    adopters: Arc<Adopters>,
    /// One permit per open connection (`max_connections`).
    slots: Arc<Semaphore>,
    /// The line for connections turned away at `max_connections`: a burst
    /// of connects must not be a burst of lines (before, one WARN each:
    /// 5,000 lines in 0.6 s; found by a black-box probe).
    full: Throttle,
}

impl Serving {
    /// Serves an accepted connection in a task of its own (its TLS
    /// handshake first, with `acceptor`), or closes it at once when the hub
    /// holds as many as it may. `from_backlog`: taken from the listener's
    /// backlog by the drain.
    fn spawn(
        &mut self,
        connections: &mut JoinSet<()>,
        stream: TcpStream,
        peer: SocketAddr,
        acceptor: Option<tokio_rustls::TlsAcceptor>,
        from_backlog: bool,
    ) {
        let Ok(permit) = self.slots.clone().try_acquire_owned() else {
            let max = self.limits.max_connections;
            metrics::counter!(crate::metric_names::CONNECTIONS_REFUSED).increment(1);
            if let Some(connections) = self.full.note(Instant::now()) {
                warn!(
                    %peer,
                    max,
                    connections,
                    "connection refused: too many open connections; `connections` counts those \
                     closed at once since the last such line"
                );
            }
            drop(stream);
            return;
        };
        if let Err(e) = stream.set_nodelay(true) {
            debug!(%e, "could not set TCP_NODELAY");
        }
        let hub = self.hub.clone();
        let in_flight = self.in_flight.clone();
        let adopters = self.adopters.clone();
        let limits = self.limits;
        let span = if acceptor.is_some() {
            info_span!("conn", %peer, tls = true)
        } else {
            info_span!("conn", %peer)
        };
        let carry = Carry {
            from_backlog,
            ..Carry::default()
        };
        connections.spawn(connection_task(
            stream, peer, acceptor, hub, limits, in_flight, adopters, carry, permit, span,
        ));
    }
}

/// What [`Serving::spawn`] spawns for an accepted connection, in its
/// span: its TLS handshake (with `acceptor`), then its service until it
/// closes, holding its slot (`permit`). What this future holds, every open
/// connection holds while it idles: keep it small (the test
/// `an_idle_connection_holds_a_small_future` measures it). One block, and
/// wrapped in nothing more: a future moved into an `async` block and
/// awaited there is stored twice, and an `async fn` keeps its arguments
/// twice.
#[allow(clippy::too_many_arguments)]
pub(super) fn connection_task<H: Answerer>(
    stream: TcpStream,
    peer: SocketAddr,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    hub: Arc<H>,
    limits: Limits,
    in_flight: Arc<InFlight>,
    adopters: Arc<Adopters>,
    carry: Carry,
    permit: OwnedSemaphorePermit,
    span: tracing::Span,
) -> impl Future<Output = ()> + Send + 'static {
    async move {
        let _permit = permit;
        let _open = OpenConnection::count();
        match acceptor {
            None => {
                let adopters = Some(adopters);
                serve_plain(stream, peer, hub, limits, in_flight, adopters, carry).await;
            }
            // Boxed: a TLS connection's future is the larger (its
            // handshake, its stream), and unboxed every plain connection
            // would be its size.
            Some(acceptor) => {
                Box::pin(async move {
                    if let Some((tls, cert)) =
                        handshake(acceptor, stream, limits.tls_handshake_timeout).await
                    {
                        serve_connection(tls, peer, cert, hub, limits, in_flight, carry, None)
                            .await;
                    }
                })
                .await
            }
        }
    }
    .instrument(span)
}

/// One open connection in the gauge, for as long as it lives.
struct OpenConnection;

impl OpenConnection {
    fn count() -> OpenConnection {
        metrics::gauge!(crate::metric_names::OPEN_CONNECTIONS).increment(1.0);
        OpenConnection
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        metrics::gauge!(crate::metric_names::OPEN_CONNECTIONS).decrement(1.0);
    }
}

/// Takes the connections waiting in `listener`'s backlog, at most `max`,
/// without waiting for more, and closes the listener. Through the socket
/// itself: the reactor may not have reported them yet.
fn backlog(listener: TcpListener, max: usize) -> Vec<(TcpStream, SocketAddr)> {
    let listener = match listener.into_std() {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(%e, "cannot take the listener's backlog; closing it");
            return Vec::new();
        }
    };
    let mut taken = Vec::new();
    // Every accept counts, failed ones too: the loop ends.
    for _ in 0..max {
        let (stream, peer) = match listener.accept() {
            Ok(x) => x,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            // The one connection's trouble (it went away, a signal): the
            // rest of the backlog is still taken.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::Interrupted
                        | std::io::ErrorKind::ConnectionAborted
                        | std::io::ErrorKind::ConnectionReset
                ) =>
            {
                debug!(%e, "a connection in the backlog went away");
                continue;
            }
            // Out of file descriptors and the like: the rest is reset.
            Err(e) => {
                tracing::error!(%e, "accept failed while taking the backlog; the rest of it is reset");
                break;
            }
        };
        match stream
            .set_nonblocking(true)
            .and_then(|()| TcpStream::from_std(stream))
        {
            Ok(stream) => taken.push((stream, peer)),
            Err(e) => warn!(%e, %peer, "a connection from the backlog could not be served; closed"),
        }
    }
    taken
}

/// The server side of a TLS handshake, bounded like a slow sender's
/// telegram; a failure is counted by reason, logged, and closes the
/// connection. Returns the stream and the client certificate's names.
async fn handshake(
    acceptor: tokio_rustls::TlsAcceptor,
    stream: TcpStream,
    timeout: Duration,
) -> Option<(TlsStream, Option<Arc<ClientCert>>)> {
    let failed = |reason: &'static str, why: &str| {
        metrics::counter!(crate::metric_names::TLS_HANDSHAKE_FAILURES, "reason" => reason)
            .increment(1);
        // A channel's doing, counted: INFO.
        info!(reason, "TLS handshake failed: {why}; connection closed");
    };
    match tokio::time::timeout(timeout, acceptor.accept(stream)).await {
        Err(_) => {
            failed(
                "timeout",
                &format!(
                    "not finished within tls_handshake_timeout_ms ({} ms)",
                    timeout.as_millis()
                ),
            );
            None
        }
        Ok(Err(e)) => {
            let (reason, why) = channel_tls::failure(&e);
            failed(reason, &why);
            None
        }
        Ok(Ok(tls)) => {
            let cert = channel_tls::client_cert(tls.get_ref().1.peer_certificates()).map(Arc::new);
            match &cert {
                Some(c) => debug!(%c, "TLS handshake done with a client certificate"),
                None => debug!("TLS handshake done"),
            }
            Some((tls, cert))
        }
    }
}
