//! TLS to a core: the target's certificate files, the rustls client config
//! made from them (swapped in on SIGHUP), and the connector that sits between
//! the TCP connector and the [`SendGate`](super::SendGate)'s connector.
//!
//! The chain is `SocketConnector -> TlsConnector -> GateConnector`: the whole
//! handshake (certificates, SNI, host-name check) happens inside `connect`,
//! below the gate, so a refused connection, a handshake failure, an expired or
//! wrong-name certificate or an unknown CA all end the call before the gate
//! passed: "not sent" (E902). Only a byte of the HTTP request handed to TLS
//! passes the gate.
//!
//! One case lies past the handshake in TLS 1.3: the client's handshake ends
//! when it has sent its Finished message, and a core that does not accept the
//! client's certificate (or wants one and got none) says so with an alert the
//! client reads *after* writing its request. A TLS stack that refuses a
//! handshake never decrypts what follows it, so an alert about certificates
//! or the handshake, read before any byte of an answer or any session ticket
//! on a fresh connection, also means "not sent" ([`refused_at_handshake`]).
//! A ticket comes only from a core whose TLS took the handshake: an alert
//! after one may follow a request the core passed on.
//!
//! Rotation: [`TlsSlot`] holds the config in force; a reload installs a new
//! one when the files' contents changed. Pooled connections made with the old
//! one are then retired (a connection is not reused once its slot moved on),
//! so the next call makes a new connection with the new files. Calls in
//! progress finish on their connection.

use std::fmt;
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use rustls::pki_types::ServerName;
use rustls::{
    AlertDescription, CertificateError, ClientConfig, ClientConnection, ProtocolVersion,
    RootCertStore,
};
use sha2::{Digest, Sha256};
use ureq::unversioned::transport::{
    Buffers, ConnectionDetails, Connector, Either, LazyBuffers, NextTimeout, Transport,
    TransportAdapter,
};

use crate::config::TargetConfig;
use crate::tls_files;
pub use crate::tls_files::TlsFileError;

/// A client config built from a target's files, and a digest of what was read
/// (to tell a reload that changed nothing from a rotation).
#[derive(Debug)]
pub struct TlsMaterial {
    config: Arc<ClientConfig>,
    digest: [u8; 32],
}

/// Reads a target's certificate files and builds its client config: TLS 1.2
/// and 1.3 only (rustls has nothing older), ring as the only provider, the
/// CAs of `ca_file` (else the Mozilla roots of webpki-roots), SNI and host-name
/// verification on, and the client certificate when one is configured.
pub fn load(cfg: &TargetConfig) -> Result<TlsMaterial, TlsFileError> {
    let mut digest = Sha256::new();
    let roots = match &cfg.ca_file {
        Some(file) => {
            let pem = tls_files::read("ca_file", file)?;
            digest.update(b"ca\0");
            digest.update(&pem);
            tls_files::trust_anchors("ca_file", file, &pem)?
        }
        None => RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        },
    };
    let builder = tls_files::client_builder()?.with_root_certificates(roots);
    let mut config = match (&cfg.client_cert_file, &cfg.client_key_file) {
        (Some(cert_file), Some(key_file)) => {
            const CERT: &str = "client_cert_file";
            const KEY: &str = "client_key_file";
            let cert_pem = tls_files::read(CERT, cert_file)?;
            let key_pem = tls_files::read(KEY, key_file)?;
            digest.update(b"cert\0");
            digest.update(&cert_pem);
            digest.update(b"key\0");
            digest.update(&key_pem);
            let chain = tls_files::certificates(CERT, cert_file, &cert_pem)?;
            let key = tls_files::private_key(KEY, key_file, &key_pem)?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| tls_files::key_mismatch((KEY, key_file), (CERT, cert_file), e))?
        }
        // Config validation refuses one without the other.
        _ => builder.with_no_client_auth(),
    };
    config.enable_sni = true;
    // Early data would put request bytes on the wire before the handshake
    // proved the core's identity; it stays off.
    config.enable_early_data = false;
    Ok(TlsMaterial {
        config: Arc::new(config),
        digest: digest.finalize().into(),
    })
}

/// The client config in force for one target, and its generation: a pooled
/// connection of an older generation is not reused.
#[derive(Debug, Clone)]
pub struct TlsSlot(Arc<SlotInner>);

#[derive(Debug)]
struct SlotInner {
    generation: AtomicU64,
    material: RwLock<TlsMaterial>,
}

impl TlsSlot {
    pub fn new(material: TlsMaterial) -> TlsSlot {
        TlsSlot(Arc::new(SlotInner {
            generation: AtomicU64::new(0),
            material: RwLock::new(material),
        }))
    }

    /// Puts `material` in force for new connections; false (and nothing
    /// changes) when the files read the same as the ones in force.
    pub fn install(&self, material: TlsMaterial) -> bool {
        let mut current = self.0.material.write().unwrap_or_else(|p| p.into_inner());
        if current.digest == material.digest {
            return false;
        }
        *current = material;
        self.0.generation.fetch_add(1, Ordering::AcqRel);
        true
    }

    fn current(&self) -> (u64, Arc<ClientConfig>) {
        let m = self.0.material.read().unwrap_or_else(|p| p.into_inner());
        (self.0.generation.load(Ordering::Acquire), m.config.clone())
    }

    fn generation(&self) -> u64 {
        self.0.generation.load(Ordering::Acquire)
    }
}

/// Why a TLS handshake with a core failed, as the log line and the metric's
/// `cause` label name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cause {
    CertificateExpired,
    CertificateNotYetValid,
    NotValidForName,
    UnknownIssuer,
    CertificateRevoked,
    BadCertificate,
    /// The core sent an alert: it refused the handshake (often our client
    /// certificate, or its absence).
    RefusedByCore(AlertDescription),
    /// No TLS version or cipher suite in common.
    Incompatible,
    Timeout,
    Closed,
    /// What answered is not TLS (its bytes are no TLS record): most often
    /// a plain-HTTP port named `https://`.
    NotTls,
    Other,
}

impl Cause {
    /// The metric label.
    pub fn label(&self) -> &'static str {
        match self {
            Cause::CertificateExpired => "certificate_expired",
            Cause::CertificateNotYetValid => "certificate_not_yet_valid",
            Cause::NotValidForName => "certificate_not_valid_for_name",
            Cause::UnknownIssuer => "unknown_issuer",
            Cause::CertificateRevoked => "certificate_revoked",
            Cause::BadCertificate => "bad_certificate",
            Cause::RefusedByCore(_) => "refused_by_core",
            Cause::Incompatible => "incompatible",
            Cause::Timeout => "timeout",
            Cause::Closed => "closed",
            Cause::NotTls => "not_tls",
            Cause::Other => "other",
        }
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cause::CertificateExpired => f.write_str("certificate expired"),
            Cause::CertificateNotYetValid => f.write_str("certificate not yet valid"),
            Cause::NotValidForName => f.write_str("certificate not valid for name"),
            Cause::UnknownIssuer => f.write_str("unknown issuer"),
            Cause::CertificateRevoked => f.write_str("certificate revoked"),
            Cause::BadCertificate => f.write_str("bad certificate"),
            Cause::RefusedByCore(AlertDescription::CertificateRequired) => {
                f.write_str("the core requires a client certificate")
            }
            Cause::RefusedByCore(a) => write!(f, "the core refused the handshake (alert {a:?})"),
            Cause::Incompatible => f.write_str("no TLS version or cipher suite in common"),
            Cause::Timeout => f.write_str("handshake timed out"),
            Cause::Closed => f.write_str("connection closed during the handshake"),
            Cause::NotTls => f.write_str("the core's side does not speak TLS"),
            Cause::Other => f.write_str("handshake failed"),
        }
    }
}

/// A failed handshake: the call ends "not sent".
#[derive(Debug)]
pub struct HandshakeError {
    pub host: String,
    pub cause: Cause,
    detail: String,
}

impl fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "TLS handshake with {} failed: {} ({}); nothing was sent",
            self.host, self.cause, self.detail
        )
    }
}

impl std::error::Error for HandshakeError {}

impl HandshakeError {
    fn new(host: &str, e: &io::Error) -> HandshakeError {
        let inner = e.get_ref();
        let cause = if let Some(r) = inner.and_then(|i| i.downcast_ref::<rustls::Error>()) {
            cause_of(r)
        } else if inner
            .and_then(|i| i.downcast_ref::<ureq::Error>())
            .is_some_and(|u| matches!(u, ureq::Error::Timeout(_)))
            || e.kind() == io::ErrorKind::TimedOut
            || e.kind() == io::ErrorKind::WouldBlock
        {
            Cause::Timeout
        } else if matches!(
            e.kind(),
            io::ErrorKind::UnexpectedEof
                | io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::BrokenPipe
        ) {
            Cause::Closed
        } else {
            Cause::Other
        };
        HandshakeError {
            host: host.to_string(),
            cause,
            detail: e.to_string(),
        }
    }
}

fn cause_of(e: &rustls::Error) -> Cause {
    match e {
        rustls::Error::InvalidCertificate(c) => match c {
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                Cause::CertificateExpired
            }
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                Cause::CertificateNotYetValid
            }
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                Cause::NotValidForName
            }
            CertificateError::UnknownIssuer => Cause::UnknownIssuer,
            CertificateError::Revoked => Cause::CertificateRevoked,
            _ => Cause::BadCertificate,
        },
        rustls::Error::AlertReceived(a) => Cause::RefusedByCore(*a),
        rustls::Error::PeerIncompatible(_) => Cause::Incompatible,
        // The first byte is no TLS record type: "HTTP/1.1 ..." starts with H.
        rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType) => Cause::NotTls,
        _ => Cause::Other,
    }
}

/// Alerts by which a TLS stack refuses a handshake; read before any answer
/// byte on a fresh connection, they mean the request was never taken in.
fn is_handshake_refusal(a: AlertDescription) -> bool {
    matches!(
        a,
        AlertDescription::CertificateRequired
            | AlertDescription::BadCertificate
            | AlertDescription::UnsupportedCertificate
            | AlertDescription::CertificateRevoked
            | AlertDescription::CertificateExpired
            | AlertDescription::CertificateUnknown
            | AlertDescription::UnknownCA
            | AlertDescription::AccessDenied
            | AlertDescription::HandshakeFailure
            | AlertDescription::DecryptError
    )
}

/// True when `e` is a handshake failure (before or, in TLS 1.3, just after
/// the client's Finished): nothing reached the core's application.
pub fn refused_at_handshake(e: &ureq::Error) -> bool {
    match e {
        ureq::Error::Io(io) => io
            .get_ref()
            .is_some_and(|i| i.downcast_ref::<HandshakeError>().is_some()),
        _ => false,
    }
}

/// The handshake error inside a ureq error, if it is one.
pub fn handshake_error(e: &ureq::Error) -> Option<&HandshakeError> {
    match e {
        ureq::Error::Io(io) => io
            .get_ref()
            .and_then(|i| i.downcast_ref::<HandshakeError>()),
        _ => None,
    }
}

/// Wraps the TCP transport of an `https://` URL in TLS with the target's
/// config in force; `http://` URLs pass through untouched.
#[derive(Debug, Clone)]
pub struct TlsConnector {
    target: String,
    slot: TlsSlot,
}

impl TlsConnector {
    pub fn new(target: &str, slot: TlsSlot) -> TlsConnector {
        TlsConnector {
            target: target.to_string(),
            slot,
        }
    }
}

/// Logs and counts a failed handshake, and makes it the call's error.
fn failed(target: &str, err: HandshakeError) -> ureq::Error {
    metrics::counter!(
        crate::metric_names::CORE_TLS_FAILURES,
        "target" => target.to_string(),
        "cause" => err.cause.label(),
    )
    .increment(1);
    tracing::warn!(
        target_name = %target,
        host = %err.host,
        cause = %err.cause,
        detail = %err.detail,
        "TLS handshake with the core failed: {}; nothing was sent (E902, failover allowed)",
        err.cause
    );
    ureq::Error::Io(io::Error::other(err))
}

impl<In: Transport> Connector<In> for TlsConnector {
    type Out = Either<In, TlsTransport>;

    fn connect(
        &self,
        details: &ConnectionDetails,
        chained: Option<In>,
    ) -> Result<Option<Self::Out>, ureq::Error> {
        let Some(transport) = chained else {
            return Ok(None);
        };
        if !details.needs_tls() || transport.is_tls() {
            return Ok(Some(Either::A(transport)));
        }
        let host = details
            .uri
            .host()
            .unwrap_or_default()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let name = ServerName::try_from(host.clone()).map_err(|e| {
            failed(
                &self.target,
                HandshakeError {
                    host: host.clone(),
                    cause: Cause::Other,
                    detail: format!("not a host name for TLS: {e}"),
                },
            )
        })?;
        let (generation, config) = self.slot.current();
        let mut conn = ClientConnection::new(config, name).map_err(|e| {
            failed(
                &self.target,
                HandshakeError::new(&host, &io::Error::other(e)),
            )
        })?;
        let mut sock = TransportAdapter::new(transport.boxed(), details.current_time.clone());
        sock.set_timeout(connect_time_left(details));
        while conn.is_handshaking() {
            if let Err(e) = conn.complete_io(&mut sock) {
                // A core that refused the handshake may have closed before
                // our flight was written (TLS 1.2: a missing or refused
                // client certificate): its alert names the cause.
                let e = if e.get_ref().is_some_and(|i| i.is::<rustls::Error>()) {
                    e
                } else {
                    pending_tls_error(&mut conn, &mut sock).unwrap_or(e)
                };
                return Err(failed(&self.target, HandshakeError::new(&host, &e)));
            }
        }
        Ok(Some(Either::B(TlsTransport {
            buffers: LazyBuffers::new(
                details.config.input_buffer_size(),
                details.config.output_buffer_size(),
            ),
            stream: rustls::StreamOwned::new(conn, sock),
            target: self.target.clone(),
            host,
            slot: self.slot.clone(),
            generation,
            answered: false,
        })))
    }
}

/// After the connection failed under us (a write or read error): reads what
/// the core sent before that and is still in the socket, and returns the TLS
/// error it makes (the core's alert), if any.
fn pending_tls_error(
    conn: &mut ClientConnection,
    sock: &mut TransportAdapter,
) -> Option<io::Error> {
    for _ in 0..4 {
        match conn.read_tls(sock) {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                if let Err(e) = conn.process_new_packets() {
                    return Some(io::Error::new(io::ErrorKind::InvalidData, e));
                }
            }
        }
    }
    None
}

/// What is left of the connect timeout: the TCP connect and the handshake
/// share it, as they share the budget.
fn connect_time_left(details: &ConnectionDetails) -> NextTimeout {
    use ureq::unversioned::transport::time::{Duration, Instant};
    let mut t = details.timeout;
    if let (Duration::Exact(limit), Instant::Exact(start), Instant::Exact(now)) =
        (t.after, details.now, (details.current_time)())
    {
        t.after = Duration::Exact(limit.saturating_sub(now.saturating_duration_since(start)));
    }
    t
}

/// A TLS connection to a core.
pub struct TlsTransport {
    buffers: LazyBuffers,
    stream: rustls::StreamOwned<ClientConnection, TransportAdapter>,
    target: String,
    host: String,
    slot: TlsSlot,
    /// The slot's generation when this connection was made.
    generation: u64,
    /// A byte of an answer was read: the handshake was certainly accepted.
    answered: bool,
}

impl fmt::Debug for TlsTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsTransport")
            .field("host", &self.host)
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

/// True when `e`, an error of a connection whose core has not shown that it
/// took our handshake (`accepted` false: no answer byte, no session ticket)
/// and that speaks `version`, is the core refusing our handshake: an alert
/// of [`is_handshake_refusal`]'s kind actually received from the peer. Only
/// TLS 1.3 can deliver such a refusal after our request went out (the
/// client's handshake ends at its own Finished); in TLS 1.2 the handshake
/// ends with the core's Finished, which says it took our certificate, so an
/// alert after it is no refusal of the handshake and the request may have
/// reached the core's application. A reset, an EOF or a timeout is never a
/// refusal.
fn refused_before_taking(version: Option<ProtocolVersion>, accepted: bool, e: &io::Error) -> bool {
    !accepted
        && version == Some(ProtocolVersion::TLSv1_3)
        && e.get_ref()
            .and_then(|i| i.downcast_ref::<rustls::Error>())
            .is_some_and(
                |r| matches!(r, rustls::Error::AlertReceived(a) if is_handshake_refusal(*a)),
            )
}

impl TlsTransport {
    /// Whether the core's TLS has shown that it took our handshake: a byte of
    /// an answer was read, or a session ticket. A TLS 1.3 server sends its
    /// tickets only once it has checked our Finished (and our certificate
    /// before it), so an alert after a ticket refuses no handshake: a peer
    /// that reads a request and then sends a handshake alert (a gateway's
    /// policy, say) may have passed the request on (found by a black-box
    /// probe: six POSTs of one GUID, each answered "not sent").
    fn accepted(&self) -> bool {
        self.answered || self.stream.conn.tls13_tickets_received() > 0
    }

    fn refused(&self, e: &io::Error) -> bool {
        refused_before_taking(self.stream.conn.protocol_version(), self.accepted(), e)
    }

    /// After a failed write or read on a connection whose core has not shown
    /// that it took our handshake: reads what the core sent before it
    /// closed, and returns its refusal of the handshake if that is what it
    /// was (a ticket read on the way means it was not).
    fn pending_refusal(&mut self) -> Option<io::Error> {
        if self.accepted() {
            return None;
        }
        let rustls::StreamOwned { conn, sock } = &mut self.stream;
        pending_tls_error(conn, sock).filter(|e| self.refused(e))
    }

    /// The call's error for `e`: the core's refusal of the handshake (counted
    /// and logged as a failed handshake: "not sent") when it is one, read now
    /// or still waiting in the socket; else `e` itself.
    fn error_after(&mut self, e: io::Error) -> ureq::Error {
        let refusal = if self.refused(&e) {
            e
        } else {
            // Reading first flushes what rustls still holds, and a core that
            // refused the handshake and closed makes that (or the write of
            // the request) fail before its alert is read.
            match self.pending_refusal() {
                Some(refused) => refused,
                None => return e.into(),
            }
        };
        failed(&self.target, HandshakeError::new(&self.host, &refusal))
    }
}

impl Transport for TlsTransport {
    fn buffers(&mut self) -> &mut dyn Buffers {
        &mut self.buffers
    }

    fn transmit_output(&mut self, amount: usize, timeout: NextTimeout) -> Result<(), ureq::Error> {
        self.stream.get_mut().set_timeout(timeout);
        let output = &self.buffers.output()[..amount];
        // A core that refused the handshake may have closed before the
        // request went out: its alert is then waiting to be read.
        self.stream
            .write_all(output)
            .map_err(|e| self.error_after(e))
    }

    fn await_input(&mut self, timeout: NextTimeout) -> Result<bool, ureq::Error> {
        self.stream.get_mut().set_timeout(timeout);
        let input = self.buffers.input_append_buf();
        match self.stream.read(input) {
            Ok(n) => {
                self.buffers.input_appended(n);
                if n > 0 {
                    self.answered = true;
                }
                Ok(n > 0)
            }
            Err(e) => Err(self.error_after(e)),
        }
    }

    fn is_open(&mut self) -> bool {
        // A connection made with files that were rotated away is not reused.
        self.slot.generation() == self.generation && self.stream.get_mut().get_mut().is_open()
    }

    fn is_tls(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls_files::tests::pem_files;
    use std::path::Path;

    fn target_with(ca: Option<&Path>, cert: Option<&Path>, key: Option<&Path>) -> TargetConfig {
        let mut t = TargetConfig::with_url("core", "https://core.example:443");
        t.ca_file = ca.map(Path::to_path_buf);
        t.client_cert_file = cert.map(Path::to_path_buf);
        t.client_key_file = key.map(Path::to_path_buf);
        t
    }

    #[test]
    fn a_bad_file_is_named_by_its_target_key() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let text = load(&target_with(Some(&missing), None, None))
            .unwrap_err()
            .to_string();
        assert!(
            text.starts_with("ca_file (")
                && text.contains("missing.pem")
                && text.contains("cannot read"),
            "{text}"
        );
        let [ca, ..] = pem_files(dir.path());
        let text = load(&target_with(Some(&ca), Some(&missing), Some(&missing)))
            .unwrap_err()
            .to_string();
        assert!(text.starts_with("client_cert_file ("), "{text}");
    }

    #[test]
    fn a_client_certificate_loads_with_its_key_and_not_with_another() {
        let dir = tempfile::tempdir().unwrap();
        let [ca, cert, key, other] = pem_files(dir.path());
        let m = load(&target_with(Some(&ca), Some(&cert), Some(&key))).unwrap();
        assert!(m.config.client_auth_cert_resolver.has_certs());
        let text = load(&target_with(Some(&ca), Some(&cert), Some(&other)))
            .unwrap_err()
            .to_string();
        assert!(
            text.contains("other.key")
                && text.contains("leaf.pem")
                && text.contains("does not go with"),
            "{text}"
        );
        // A key file holding a certificate is no key.
        let text = load(&target_with(Some(&ca), Some(&cert), Some(&ca)))
            .unwrap_err()
            .to_string();
        assert!(text.contains("no PEM private key"), "{text}");
    }

    #[test]
    fn a_rotation_moves_the_generation_and_the_same_files_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let [ca, cert, key, _] = pem_files(dir.path());
        let slot = TlsSlot::new(load(&target_with(Some(&ca), None, None)).unwrap());
        assert!(!slot.install(load(&target_with(Some(&ca), None, None)).unwrap()));
        assert_eq!(slot.generation(), 0);
        assert!(slot.install(load(&target_with(Some(&ca), Some(&cert), Some(&key))).unwrap()));
        assert_eq!(slot.generation(), 1);
        assert!(slot.current().1.client_auth_cert_resolver.has_certs());
    }

    #[test]
    fn handshake_causes_read_as_the_log_says() {
        use rustls::Error as E;
        let expired = E::InvalidCertificate(CertificateError::Expired);
        assert_eq!(cause_of(&expired).to_string(), "certificate expired");
        assert_eq!(
            cause_of(&E::InvalidCertificate(CertificateError::NotValidForName)).label(),
            "certificate_not_valid_for_name"
        );
        assert_eq!(
            cause_of(&E::InvalidCertificate(CertificateError::UnknownIssuer)).to_string(),
            "unknown issuer"
        );
        assert_eq!(
            cause_of(&E::AlertReceived(AlertDescription::CertificateRequired)).to_string(),
            "the core requires a client certificate"
        );
        assert!(is_handshake_refusal(AlertDescription::BadCertificate));
        assert!(!is_handshake_refusal(AlertDescription::CloseNotify));
        let timeout = io::Error::other(ureq::Error::Timeout(ureq::Timeout::Connect));
        assert_eq!(HandshakeError::new("h", &timeout).cause, Cause::Timeout);
        let eof = io::Error::new(io::ErrorKind::UnexpectedEof, "eof");
        assert_eq!(HandshakeError::new("h", &eof).cause, Cause::Closed);
    }

    /// Only an alert refusing the handshake, received on a TLS 1.3
    /// connection whose core has not shown that it took the handshake (no
    /// answer byte, no session ticket), is "not sent"; nothing else read
    /// after the request went out is.
    #[test]
    fn only_a_tls13_refusal_alert_before_any_answer_is_not_sent() {
        use rustls::Error as E;
        let tls13 = Some(ProtocolVersion::TLSv1_3);
        let tls12 = Some(ProtocolVersion::TLSv1_2);
        let alert = |a| io::Error::new(io::ErrorKind::InvalidData, E::AlertReceived(a));
        let required = alert(AlertDescription::CertificateRequired);
        assert!(refused_before_taking(tls13, false, &required));
        assert!(refused_before_taking(
            tls13,
            false,
            &alert(AlertDescription::BadCertificate)
        ));
        // An answer byte or a session ticket was read (every pooled
        // connection has read an answer): the handshake was accepted.
        assert!(!refused_before_taking(tls13, true, &required));
        // TLS 1.2: the core's Finished accepted our certificate before the
        // request went out; an alert after it is no refusal of the handshake.
        assert!(!refused_before_taking(tls12, false, &required));
        assert!(!refused_before_taking(None, false, &required));
        // Other alerts, and a reset, an EOF, a timeout or another TLS error.
        for other in [
            alert(AlertDescription::CloseNotify),
            alert(AlertDescription::InternalError),
            alert(AlertDescription::UnexpectedMessage),
            io::Error::new(io::ErrorKind::ConnectionReset, "reset"),
            io::Error::new(io::ErrorKind::UnexpectedEof, "eof"),
            io::Error::new(io::ErrorKind::TimedOut, "timed out"),
            io::Error::other(ureq::Error::Timeout(ureq::Timeout::RecvResponse)),
            io::Error::new(io::ErrorKind::InvalidData, E::DecryptError),
        ] {
            assert!(!refused_before_taking(tls13, false, &other), "{other}");
        }
    }

    #[test]
    fn without_a_ca_file_the_built_in_roots_are_used() {
        let m = load(&target_with(None, None, None)).unwrap();
        assert!(!m.config.client_auth_cert_resolver.has_certs());
        let slot = TlsSlot::new(m);
        assert_eq!(slot.generation(), 0);
        // The same files again change nothing; pooled connections stay.
        assert!(!slot.install(load(&target_with(None, None, None)).unwrap()));
        assert_eq!(slot.generation(), 0);
    }
}
