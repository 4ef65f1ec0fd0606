//! Calls to a core system over HTTP (ureq), each ending in a typed result whose
//! variant says whether a request byte may have left the hub.
//!
//! ureq reports *which* deadline fired, not *when* in the exchange it fired, and a
//! DNS failure arrives as a plain I/O error; so the phase is never guessed from an
//! error. Instead every connection ureq opens is wrapped in a [`GatedTransport`]
//! that passes a per-call [`SendGate`] before it writes its first byte. The gate is
//! an atomic that either the transport (first write: "sent") or the hub (budget
//! ran out: "abandoned") claims first, so the two can never disagree:
//!
//! * gate still `QUEUED` or `CONNECTING` when the call failed: nothing was sent;
//! * gate `SENT`: the core may have the request;
//! * the hub abandons a call whose gate is not yet `SENT`, and the transport then
//!   refuses to write: nothing is ever sent after the channel was told "not sent".
//!
//! Calls run on the target's own caller threads (ureq is synchronous; see
//! `caller.rs`), and host names come from a cache (`resolver.rs`). A transfer call that
//! is still waiting when the budget ends goes on for the target's late-answer
//! window; its result is handed back as a [`LateAnswer`] so it can be journaled.
//!
//! Stale pooled connections: ureq probes a pooled socket before reusing it
//! (one `recv` that does not wait, `socket.rs`) and drops it when the peer has
//! closed it, so a core that closes idle keep-alive
//! connections costs a fresh connect, not an "unknown". What remains is the race
//! where the peer closes in the instant between the probe and the write: that
//! request may have been written, so it is (correctly) "unknown", E901, and the
//! channel's resend is answered by inquiry. A core that closes every
//! connection right after answering loses that race often; the target then
//! stops reusing connections for a while (`closes.rs`).

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};
use tokio::time::Instant;
use ureq::http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HOST, RETRY_AFTER, USER_AGENT};
use ureq::http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Uri};
use ureq::unversioned::transport::{Buffers, ConnectionDetails, Connector, NextTimeout, Transport};

use crate::config::TargetConfig;

pub(crate) mod caller;
mod closes;
mod resolver;
mod socket;
pub mod tls;

use caller::{Callers, Work};
use resolver::CachedResolver;

/// The header carrying the hub's remaining budget in milliseconds, so a core (or
/// a gateway) can give up on work nobody is waiting for.
pub const DEADLINE_HEADER: &str = "X-Expected-Timeout-Ms";

/// The W3C Trace Context header every call carries: `00-TRACE-PARENT-01`,
/// the trace id of the telegram being answered and a span id of the call's own.
pub const TRACEPARENT_HEADER: &str = "traceparent";

// The request's header names, made once: a name given as text is parsed (and
// a non-standard one copied) on every call. HTTP/1 writes them in lower case
// whichever way they were given.
const DEADLINE_NAME: HeaderName = HeaderName::from_static("x-expected-timeout-ms");
const TRACEPARENT_NAME: HeaderName = HeaderName::from_static(TRACEPARENT_HEADER);
const GUID_NAME: HeaderName = HeaderName::from_static("x-guid");
const REPLAYED_NAME: HeaderName = HeaderName::from_static("idempotent-replayed");

/// A W3C trace id: one per telegram, random, never zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceId(pub u128);

tokio::task_local! {
    /// The trace id of the telegram this task answers.
    static TRACE_ID: TraceId;
}

impl TraceId {
    pub fn new() -> TraceId {
        loop {
            let id = (u128::from(crate::random::random_u64()) << 64)
                | u128::from(crate::random::random_u64());
            if id != 0 {
                return TraceId(id);
            }
        }
    }

    /// Runs `f` with this trace id on every core call it makes.
    /// (Not an `async fn`: that would hold `f` twice in its state, and
    /// the telegram's future is copied whole as it moves.)
    pub fn scope<F: std::future::Future>(
        self,
        f: F,
    ) -> impl std::future::Future<Output = F::Output> {
        TRACE_ID.scope(self, f)
    }

    /// The trace id of the telegram being answered, if any.
    pub fn current() -> Option<TraceId> {
        TRACE_ID.try_with(|t| *t).ok()
    }

    /// The id's text.
    pub fn text(self) -> TraceText {
        let mut text = [0u8; 32];
        crate::hex::encode_into(&self.0.to_be_bytes(), &mut text);
        TraceText(text)
    }

    /// The `traceparent` value for one call: a fresh span id, sampled.
    fn traceparent(&self) -> String {
        let span = loop {
            let s = crate::random::random_u64();
            if s != 0 {
                break s;
            }
        };
        let mut text = String::with_capacity(55);
        text.push_str("00-");
        text.push_str(self.text().as_str());
        text.push('-');
        crate::hex::push(&mut text, &span.to_be_bytes());
        text.push_str("-01");
        text
    }
}

/// A trace id as text ([`TraceId::text`], 32 lowercase hex digits),
/// written without the formatting machinery: every telegram's log span and
/// console entry carry one.
#[derive(Clone, Copy)]
pub struct TraceText([u8; 32]);

impl TraceText {
    pub fn as_str(&self) -> &str {
        // Only ASCII hex digits were written.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl std::fmt::Display for TraceText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Default for TraceId {
    fn default() -> Self {
        TraceId::new()
    }
}

impl std::fmt::Display for TraceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.text().as_str())
    }
}

/// Largest answer body the hub reads from a core.
const MAX_BODY: u64 = 64 * 1024;

const QUEUED: u8 = 0;
const CONNECTING: u8 = 1;
const SENT: u8 = 2;
const ABANDONED: u8 = 3;
/// The licence was refused at the first byte: nothing was sent.
const REFUSED: u8 = 4;

/// Whether this hub may still send a transfer's first byte: the fence of a
/// shared journal (a hub that cannot renew its liveness must not post, since
/// the other hubs may soon take its transfers over). `Err` says why not.
pub type SendLicence = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// Per-call state shared by the hub and the connection that carries the call.
#[derive(Clone, Default)]
pub struct SendGate {
    /// One allocation per call for all that is shared.
    shared: Arc<GateShared>,
    /// Asked at the first request byte, so no check-to-write gap is left.
    licence: Option<SendLicence>,
    /// A number per call, for [`GatedTransport`] to tell calls apart.
    call: u64,
}

#[derive(Default)]
struct GateShared {
    state: AtomicU8,
    refusal: std::sync::OnceLock<String>,
    /// The call's bytes went on a connection an earlier call used (kept
    /// alive): an answer there may be the core's, sent unasked as it
    /// closed the idle connection (a 408), not one to this request.
    reused: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for SendGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendGate")
            .field("state", &self.shared.state.load(Ordering::Relaxed))
            .field("licensed", &self.licence.is_some())
            .finish()
    }
}

impl SendGate {
    fn new(licence: Option<SendLicence>) -> Self {
        static CALLS: AtomicU64 = AtomicU64::new(1);
        SendGate {
            licence,
            call: CALLS.fetch_add(1, Ordering::Relaxed),
            ..SendGate::default()
        }
    }

    /// Whether the call's bytes went on a connection an earlier call used.
    fn reused(&self) -> bool {
        self.shared.reused.load(Ordering::Relaxed)
    }

    /// A caller thread took the call; false if it was abandoned first.
    fn start(&self) -> bool {
        self.shared
            .state
            .compare_exchange(QUEUED, CONNECTING, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// About to write a request byte; false if the hub abandoned the call or
    /// the licence is refused now.
    fn pass(&self) -> bool {
        if let Some(licence) = &self.licence
            && self.shared.state.load(Ordering::Acquire) == CONNECTING
            && let Err(why) = licence()
        {
            if self
                .shared
                .state
                .compare_exchange(CONNECTING, REFUSED, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                let _ = self.shared.refusal.set(why);
            }
            return false;
        }
        match self.shared.state.compare_exchange(
            CONNECTING,
            SENT,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => true,
            Err(state) => state == SENT,
        }
    }

    /// The hub gives up; returns the state it found (`SENT` means too late).
    fn abandon(&self) -> u8 {
        let mut state = self.shared.state.load(Ordering::Acquire);
        loop {
            if state == SENT || state == ABANDONED || state == REFUSED {
                return state;
            }
            match self.shared.state.compare_exchange(
                state,
                ABANDONED,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return state,
                Err(now) => state = now,
            }
        }
    }

    fn was_sent(&self) -> bool {
        self.shared.state.load(Ordering::Acquire) == SENT
    }

    /// Why the licence was refused at the first byte, if it was.
    fn refused(&self) -> Option<&str> {
        self.shared.refusal.get().map(String::as_str)
    }
}

thread_local! {
    /// The gate of the call running on this (caller) thread.
    static CURRENT_GATE: RefCell<Option<SendGate>> = const { RefCell::new(None) };
}

/// A connector that wraps whatever the TCP connector opened in a [`GatedTransport`].
#[derive(Debug, Clone, Copy)]
struct GateConnector;

impl<In: Transport> Connector<In> for GateConnector {
    type Out = GatedTransport<In>;

    fn connect(
        &self,
        _details: &ConnectionDetails,
        chained: Option<In>,
    ) -> Result<Option<Self::Out>, ureq::Error> {
        Ok(chained.map(|inner| GatedTransport {
            inner,
            last_call: None,
        }))
    }
}

/// A transport that asks the current call's gate before writing, and tells
/// it when the connection carried an earlier call.
#[derive(Debug)]
struct GatedTransport<T> {
    inner: T,
    /// The call that last wrote here (its gate's number).
    last_call: Option<u64>,
}

impl<T: Transport> Transport for GatedTransport<T> {
    fn buffers(&mut self) -> &mut dyn Buffers {
        self.inner.buffers()
    }

    fn transmit_output(&mut self, amount: usize, timeout: NextTimeout) -> Result<(), ureq::Error> {
        if amount > 0 {
            let allowed = CURRENT_GATE.with(|g| match g.borrow().as_ref() {
                Some(gate) => {
                    if self
                        .last_call
                        .replace(gate.call)
                        .is_some_and(|last| last != gate.call)
                    {
                        gate.shared.reused.store(true, Ordering::Relaxed);
                    }
                    gate.pass()
                }
                None => true,
            });
            if !allowed {
                return Err(ureq::Error::Io(std::io::Error::other(
                    "call abandoned by the hub before any byte was sent",
                )));
            }
        }
        self.inner.transmit_output(amount, timeout)
    }

    fn await_input(&mut self, timeout: NextTimeout) -> Result<bool, ureq::Error> {
        self.inner.await_input(timeout)
    }

    fn is_open(&mut self) -> bool {
        self.inner.is_open()
    }

    fn is_tls(&self) -> bool {
        self.inner.is_tls()
    }
}

/// The variables ureq would read a proxy from. The hub ignores them for its
/// calls to a core: a proxy that accepted the request's bytes and then failed
/// would turn "not sent" (E902, safe to resend) into "may have been sent"
/// (E901), and one that is down would make every transfer E902.
pub const PROXY_VARIABLES: [&str; 6] = [
    "ALL_PROXY",
    "all_proxy",
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
];

/// Says once per process which proxy variables are set and ignored.
fn note_ignored_proxies() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let set: Vec<&str> = PROXY_VARIABLES
            .into_iter()
            .filter(|v| std::env::var_os(v).is_some_and(|x| !x.is_empty()))
            .collect();
        if !set.is_empty() {
            // Names only: a proxy URL may hold credentials.
            tracing::info!(
                variables = %set.join(", "),
                "proxy environment variables ignored: the hub calls its targets directly, \
                 so that \"not sent\" stays certain"
            );
        }
    });
}

/// An HTTP answer, whatever its status.
#[derive(Debug, Clone)]
pub struct HttpAnswer {
    pub status: u16,
    pub body: Vec<u8>,
    pub retry_after: Option<String>,
    pub replayed: bool,
}

/// Why a call produced no answer; the variant is the phase it failed in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallFailure {
    /// No byte left the hub (refused, connect timeout, DNS, abandoned while
    /// connecting). Safe to retry or resend.
    NotSent(String),
    /// The hub had no capacity to start the call (bulkhead, no caller thread).
    NoCapacity(String),
    /// A request byte may have reached the target; never resend blindly.
    MaybeSent(String),
}

/// The result of one call within the budget.
pub enum CallEnd {
    /// An answer or a failure, known within the budget.
    Done(Result<HttpAnswer, CallFailure>),
    /// Sent, and the budget ran out while waiting; the call goes on and its
    /// late answer arrives on the receiver.
    Pending(LateAnswer),
}

/// The eventual result of a call that outlived the budget.
pub type LateAnswer = oneshot::Receiver<Result<HttpAnswer, CallFailure>>;

/// The two requests the hub makes.
#[derive(Debug, Clone)]
pub enum CoreRequest {
    /// `POST /v1/transfers` with `X-GUID`.
    /// Shared, not copied, by each attempt's call.
    Transfer { guid: Arc<str>, json: Arc<[u8]> },
    /// `GET /v1/transfers/{guid}`.
    Inquiry { guid: String },
}

impl CoreRequest {
    /// The transfer's GUID (an inquiry's: the transfer it asks about).
    fn guid(&self) -> &str {
        match self {
            CoreRequest::Transfer { guid, .. } => guid,
            CoreRequest::Inquiry { guid } => guid,
        }
    }

    /// The request's URL at the base URL `base`.
    fn url_at(&self, base: &str) -> String {
        match self {
            CoreRequest::Transfer { .. } => transfer_url(base),
            CoreRequest::Inquiry { guid } => [base, "/v1/transfers/", guid].concat(),
        }
    }
}

/// `POST /v1/transfers` at the base URL `base`.
fn transfer_url(base: &str) -> String {
    [base, "/v1/transfers"].concat()
}

/// How many agents (connection pools) a target's calls are spread over.
const AGENTS: usize = 16;

/// The headers of a request to a core, at most: host, user-agent, accept,
/// the deadline, traceparent, authorization, content-type, x-guid and
/// content-length (ureq's).
const REQUEST_HEADERS: usize = 9;

/// The `User-Agent` of every request to a core.
const USER_AGENT_TEXT: &str = concat!("relayhub/", env!("CARGO_PKG_VERSION"));

/// The `Host` header ureq would write for `uri`: its host, with the port
/// when it is not the scheme's default (`maybe_with_port` in ureq-proto).
/// Made once per URL: ureq makes it on every request (a `format!`, a copy
/// and two parses of the authority), and writes none of its own when the
/// request has one.
fn host_header(uri: &Uri) -> Option<HeaderValue> {
    let host = uri.host()?;
    let default = match uri.scheme_str() {
        Some("https") => Some(443),
        Some("http") | None => Some(80),
        Some(_) => None,
    };
    let text = match (uri.port(), default) {
        (Some(port), Some(default)) if port != default => format!("{host}:{port}"),
        _ => host.to_string(),
    };
    HeaderValue::try_from(text).ok()
}

/// One configured target: its endpoints, agents, bulkhead and timeouts.
pub struct Target {
    pub name: String,
    urls: Vec<String>,
    /// Each base URL's `POST /v1/transfers` URL, parsed once (a transfer's
    /// URL is the same for every telegram), with its `Host` header; `None`
    /// if it does not parse, and the call reports that as it always did.
    transfer_uris: Vec<Option<(Uri, Option<HeaderValue>)>>,
    /// [`AGENTS`] agents with the same config, parts and resolver; the
    /// thread that runs a call keeps to one (see [`this_threads_agent`]).
    agents: Arc<[ureq::Agent]>,
    connect_timeout: Duration,
    late_window: Duration,
    /// How old an attempt must be before "never received" is proof.
    pub wire_grace: Duration,
    /// `wire_grace` stands in for a grace not known here (an offline
    /// reconcile without the hub's config): an attempt stamped with its own
    /// grace is judged by that alone.
    pub wire_grace_is_fallback: bool,
    bulkhead: Arc<Semaphore>,
    max_concurrency: usize,
    queue_wait: Duration,
    pub connect_attempts: u32,
    pub inquiry_attempts: u32,
    backoff: Duration,
    auth: Option<String>,
    /// The TLS client config in force for `https://` URLs (rotated on SIGHUP).
    tls: tls::TlsSlot,
    /// The threads that make the calls (ureq blocks).
    callers: Callers,
    /// Asked at each transfer's first request byte, when set (shared journal).
    licence: std::sync::OnceLock<SendLicence>,
    /// Its core call duration histograms.
    pub meters: crate::meters::CallMeters,
}

/// Why a target could not be built from its (validated) config.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error(transparent)]
    Auth(#[from] crate::config::AuthError),
    #[error(transparent)]
    Tls(#[from] tls::TlsFileError),
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("name", &self.name)
            .field("urls", &self.urls)
            .finish_non_exhaustive()
    }
}

impl Target {
    /// Builds the agent for a validated target config; reads its certificate
    /// files.
    ///
    /// The connector chain is TCP, then TLS (`https://` URLs only), then the
    /// gate: the handshake happens below the [`SendGate`], so a failed one is
    /// "not sent", and the gate passes on the first byte of the HTTP request.
    pub fn new(cfg: &TargetConfig, budget: Duration) -> Result<Target, TargetError> {
        // Each agent's pool keeps its share of the connections a full
        // bulkhead has open.
        let pooled = cfg.max_concurrency.max(16).div_ceil(AGENTS);
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .no_delay(true)
            .max_idle_connections(pooled)
            .max_idle_connections_per_host(pooled)
            .user_agent(USER_AGENT_TEXT)
            // Requests and answers are small; ureq's 128 KiB default buffers
            // would be kept by every pooled connection.
            .input_buffer_size(16 * 1024)
            .output_buffer_size(16 * 1024)
            // Never through a proxy from the environment: see `PROXY_VARIABLES`.
            .proxy(None)
            .build();
        note_ignored_proxies();
        let tls = tls::TlsSlot::new(tls::load(cfg)?);
        let tls_connector = tls::TlsConnector::new(&cfg.name, tls.clone());
        let urls: Vec<String> = cfg
            .urls
            .iter()
            .map(|u| u.trim_end_matches('/').to_string())
            .collect();
        let resolver = CachedResolver::start(
            &cfg.name,
            &urls,
            Duration::from_millis(cfg.resolve_refresh_ms),
        );
        // One watch for all the target's agents: they share its core.
        let closes = Arc::new(closes::CloseWatch::new(&cfg.name));
        let agents = (0..AGENTS)
            .map(|_| {
                let connector =
                    ().chain(socket::SocketConnector::new(closes.clone()))
                        .chain(tls_connector.clone())
                        .chain(GateConnector);
                ureq::Agent::with_parts(config.clone(), connector, resolver.clone())
            })
            .collect();
        let auth = cfg.auth.as_ref().map(|a| a.header_value()).transpose()?;
        Ok(Target {
            name: cfg.name.clone(),
            transfer_uris: urls
                .iter()
                .map(|base| {
                    let uri = Uri::try_from(transfer_url(base)).ok()?;
                    let host = host_header(&uri);
                    Some((uri, host))
                })
                .collect(),
            urls,
            agents,
            connect_timeout: cfg.effective_connect_timeout(budget),
            late_window: Duration::from_millis(cfg.late_answer_window_ms),
            wire_grace: cfg.effective_wire_grace(budget),
            wire_grace_is_fallback: false,
            bulkhead: Arc::new(Semaphore::new(cfg.max_concurrency)),
            max_concurrency: cfg.max_concurrency,
            queue_wait: cfg.effective_queue_wait(budget),
            connect_attempts: cfg.connect_attempts,
            inquiry_attempts: cfg.inquiry_attempts,
            backoff: Duration::from_millis(cfg.backoff_ms),
            auth,
            tls,
            callers: Callers::new("relayhub-call"),
            licence: std::sync::OnceLock::new(),
            meters: crate::meters::CallMeters::default(),
        })
    }

    /// Puts newly read certificate files in force for new connections (SIGHUP);
    /// false when they read the same as the ones in force. Pooled connections
    /// made with the old files are not reused; calls in progress finish.
    pub fn rotate_tls(&self, material: tls::TlsMaterial) -> bool {
        self.tls.install(material)
    }

    /// From now on, every transfer's first request byte needs `licence` (set
    /// once, at start, for a shared journal's fence); a refusal is "not sent"
    /// and answered E903.
    pub fn require_licence(&self, licence: SendLicence) {
        let _ = self.licence.set(licence);
    }

    /// Calls in progress on this target (for metrics).
    pub fn in_flight(&self) -> usize {
        self.max_concurrency - self.bulkhead.available_permits()
    }

    /// Calls this target may have in progress at once (its bulkhead).
    pub fn capacity(&self) -> usize {
        self.max_concurrency
    }

    /// Waits for a bulkhead slot, at most the queue wait and never past the
    /// deadline; a refusal is counted and means nothing was sent.
    pub async fn slot(&self, deadline: Instant) -> Result<OwnedSemaphorePermit, CallFailure> {
        let until = Instant::now()
            .checked_add(self.queue_wait)
            .map_or(deadline, |t| deadline.min(t));
        match tokio::time::timeout_at(until, self.bulkhead.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Ok(permit),
            _ => {
                metrics::counter!(crate::metric_names::BULKHEAD_REJECTIONS, "target" => self.name.clone())
                    .increment(1);
                Err(CallFailure::NoCapacity(format!(
                    "no free slot for target {}",
                    self.name
                )))
            }
        }
    }

    /// The backoff before retry `n` (1-based): full jitter over `backoff * 2^(n-1)`.
    pub fn backoff(&self, n: u32) -> Duration {
        let cap = self
            .backoff
            .saturating_mul(1u32 << (n.saturating_sub(1)).min(16));
        cap.mul_f64(crate::random::random_unit())
    }

    /// The endpoint for attempt `n` (0-based): failover walks the list.
    pub fn url_for(&self, attempt: u32) -> &str {
        &self.urls[attempt as usize % self.urls.len()]
    }

    /// The request's URL at `base_url`, parsed, and its `Host` header: a
    /// transfer's both from the target's own, made when it was (`base_url`
    /// may also be one the journal recorded, no longer configured); for
    /// anything else no `Host`, which ureq then makes.
    fn uri_of(
        &self,
        request: &CoreRequest,
        base_url: &str,
    ) -> (Result<Uri, String>, Option<HeaderValue>) {
        if let CoreRequest::Transfer { .. } = request
            && let Some((uri, host)) = self
                .urls
                .iter()
                .position(|u| u == base_url)
                .and_then(|i| self.transfer_uris[i].clone())
        {
            return (Ok(uri), host);
        }
        let url = request.url_at(base_url);
        (Uri::try_from(url.as_str()).map_err(|_| url), None)
    }

    /// The base URLs, in failover order.
    pub fn urls(&self) -> &[String] {
        &self.urls
    }

    /// How long a transfer's call may go on after the budget for a late
    /// answer (`late_answer_window_ms`; zero: it ends with the budget).
    pub fn late_window(&self) -> Duration {
        self.late_window
    }

    /// [`Target::wire_grace`] in ms, as a claim stamps it on the row.
    pub fn grace_ms(&self) -> i64 {
        i64::try_from(self.wire_grace.as_millis()).unwrap_or(i64::MAX)
    }

    /// Attempt `n` (0-based) of a request: a bulkhead slot, then the call on
    /// the endpoint for that attempt. No slot means nothing was sent.
    pub async fn attempt(&self, request: &CoreRequest, n: u32, deadline: Instant) -> CallEnd {
        self.attempt_at(request, self.url_for(n), deadline).await
    }

    /// One try of a request at the base URL `url`: a bulkhead slot, then the
    /// call. No slot means nothing was sent.
    pub async fn attempt_at(&self, request: &CoreRequest, url: &str, deadline: Instant) -> CallEnd {
        match self.slot(deadline).await {
            Ok(permit) => self.call(request, url, deadline, permit).await,
            Err(refused) => CallEnd::Done(Err(refused)),
        }
    }

    /// One HTTP exchange, answered by `deadline` whatever the core does.
    ///
    /// A transfer that was sent keeps running for the late-answer window past
    /// the deadline; an inquiry ends with the deadline.
    pub async fn call(
        &self,
        request: &CoreRequest,
        base_url: &str,
        deadline: Instant,
        permit: OwnedSemaphorePermit,
    ) -> CallEnd {
        let now = Instant::now();
        let Some(remaining) = deadline
            .checked_duration_since(now)
            .filter(|d| !d.is_zero())
        else {
            return CallEnd::Done(Err(CallFailure::NoCapacity(
                "no budget left to start the call".into(),
            )));
        };
        let call_limit = match request {
            CoreRequest::Transfer { .. } => remaining.saturating_add(self.late_window),
            CoreRequest::Inquiry { .. } => remaining,
        };
        let connect = self.connect_timeout.min(remaining);
        let licence = match request {
            CoreRequest::Transfer { .. } => self.licence.get().cloned(),
            // A GET changes nothing at the core: always safe.
            CoreRequest::Inquiry { .. } => None,
        };
        let gate = SendGate::new(licence);
        let (tx, mut rx) = oneshot::channel();
        let (uri, host) = self.uri_of(request, base_url);
        let job = Job {
            agents: self.agents.clone(),
            request: request.clone(),
            uri,
            host,
            connect,
            call_limit,
            remaining_ms: remaining.as_millis() as u64,
            auth: self.auth.clone(),
            // A call outside any telegram (reconcile) starts a trace of its own.
            trace: TraceId::current().unwrap_or_default(),
            gate: gate.clone(),
        };
        let work: Work = Box::new(move || {
            let _permit = permit;
            if !job.gate.start() {
                return;
            }
            let result = job.run();
            let _ = tx.send(result);
        });
        let Ok(here) = self.callers.run_or_stash(work, deadline) else {
            // Dropped unrun: the gate never left `QUEUED`.
            return CallEnd::Done(Err(CallFailure::NoCapacity(
                "no thread could be started for the call".into(),
            )));
        };
        // Run on this thread right after this poll (an adopter's stash),
        // under its clock's lease, which moves the telegram to the reactor
        // by the deadline: a call that ends first needs no timer (a lock on
        // the runtime's timer wheel, shared by every thread, twice per
        // telegram). The reactor's poll registers it.
        let early = if here {
            crate::stash::by_the_next_poll(&mut rx).await
        } else {
            None
        };
        let ended = match early {
            Some(result) => Ok(result),
            None => tokio::time::timeout_at(deadline, &mut rx).await,
        };
        match ended {
            Ok(Ok(result)) => {
                if let Ok(answer) = &result {
                    match answer.status {
                        // The hub follows no redirect: the URL is wrong.
                        300..=399 => tracing::error!(
                            target_name = %self.name,
                            status = answer.status,
                            "the core answered a redirect: configuration error, check the target's urls; the outcome is unknown (E901)"
                        ),
                        // Not HTTP as a core speaks it: something else answers.
                        ..=199 | 600.. => tracing::error!(
                            target_name = %self.name,
                            status = answer.status,
                            "the core answered a status outside HTTP's classes: check the target's urls; the outcome is unknown (E901)"
                        ),
                        _ => {}
                    }
                }
                CallEnd::Done(result)
            }
            Ok(Err(_)) => CallEnd::Done(Err(if gate.was_sent() {
                CallFailure::MaybeSent("the call ended without a result".into())
            } else {
                CallFailure::NotSent("the call ended before sending".into())
            })),
            Err(_) => match gate.abandon() {
                QUEUED => CallEnd::Done(Err(CallFailure::NoCapacity(
                    "the call did not start within the budget".into(),
                ))),
                CONNECTING => CallEnd::Done(Err(CallFailure::NotSent(
                    "still connecting when the budget ran out; abandoned".into(),
                ))),
                REFUSED => CallEnd::Done(Err(CallFailure::NoCapacity(
                    gate.refused().unwrap_or("not licensed to send").to_string(),
                ))),
                _ => CallEnd::Pending(rx),
            },
        }
    }
}

/// The agent for calls run on this thread. ureq's pool is one list under
/// one lock, and every call scans it (twice, with the handles of every
/// connection it made): with 1,000 calls at once that scan was a tenth of the
/// hub's CPU. Split over [`AGENTS`] pools, a thread keeps to one, so a
/// connection goes back to the pool its thread takes from. The thread is the
/// one that *runs* the call (a caller thread, or an adopter running its
/// stash), not the one that polls the telegram's future: the reactor's few
/// workers poll most calls, and choosing there crowded them into as many
/// pools, each keeping only its share of idle connections.
fn this_threads_agent(agents: &[ureq::Agent]) -> &ureq::Agent {
    thread_local! {
        static SHARD: usize = {
            static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
            NEXT.fetch_add(1, Ordering::Relaxed)
        };
    }
    &agents[SHARD.with(|s| *s) % agents.len()]
}

/// Everything the blocking thread needs for one exchange.
struct Job {
    /// The target's agents; the exchange uses its thread's.
    agents: Arc<[ureq::Agent]>,
    request: CoreRequest,
    /// The request's whole URL, parsed, or its text when it does not parse
    /// (the call then fails as ureq failed when it parsed URLs itself).
    uri: Result<Uri, String>,
    /// The `Host` header made for the URL, if it was.
    host: Option<HeaderValue>,
    connect: Duration,
    call_limit: Duration,
    remaining_ms: u64,
    auth: Option<String>,
    trace: TraceId,
    gate: SendGate,
}

impl Job {
    fn run(self) -> Result<HttpAnswer, CallFailure> {
        CURRENT_GATE.with(|g| *g.borrow_mut() = Some(self.gate.clone()));
        let result = self.exchange();
        CURRENT_GATE.with(|g| *g.borrow_mut() = None);
        if let Ok(answer) = &result
            && answer.status == 408
            && self.gate.reused()
        {
            // A server closing an idle keep-alive connection may send a 408
            // first, unasked; the request written meanwhile meets it. It
            // says the core took no request in, but it may not be this
            // request's answer: not a final one (E500), unknown.
            return Err(CallFailure::MaybeSent(
                "408 on a kept-alive connection: the core's close of an idle connection, \
                 not known to answer this request"
                    .into(),
            ));
        }
        result.map_err(|e| {
            if let Some(why) = self.gate.refused() {
                // Refused at the first byte: nothing left, and no capacity
                // to send (E903: the claim holds the GUID's only attempt;
                // a hub fenced before its claim answers E901 instead).
                return CallFailure::NoCapacity(why.to_string());
            }
            let reason = describe(&e);
            // A handshake the core refused took nothing in, even when (TLS
            // 1.3) its refusal is read after the request was handed over.
            let sent = self.gate.was_sent() && !tls::refused_at_handshake(&e);
            if matches!(e, ureq::Error::Protocol(_)) {
                // An answer that does not start as HTTP/1.1 does (a TLS
                // core's alert to a plain request, most often): every call
                // fails so until the URL is fixed.
                tracing::error!(
                    // This thread is not in the telegram's span: its GUID here.
                    guid = self.request.guid(),
                    // The URL's host and port: no path, no userinfo.
                    host = self.host_text(),
                    "the core's answer is not HTTP as the hub reads it ({reason}): a TLS core \
                     named http:// in the target's urls (it needs https://), or a core or \
                     gateway that frames its answers wrongly; {}",
                    if sent {
                        "the outcome is unknown (E901)"
                    } else {
                        "nothing was sent"
                    }
                );
            }
            if sent {
                CallFailure::MaybeSent(reason)
            } else {
                CallFailure::NotSent(reason)
            }
        })
    }

    /// The host the call went to, for a log line: the `Host` header made for
    /// a transfer's URL, else (an inquiry's URL is made per call) the URL's
    /// host and port.
    fn host_text(&self) -> String {
        // A URL that does not parse has none: its text may hold credentials.
        let made = self.uri.as_ref().ok().and_then(host_header);
        self.host
            .as_ref()
            .or(made.as_ref())
            .and_then(|h| h.to_str().ok())
            .unwrap_or("?")
            .to_owned()
    }

    /// The request to the core: what every request carries (the deadline
    /// header, the trace, credentials) and the timeouts of this call (connect
    /// within the budget; the whole exchange within the budget plus, for a
    /// transfer, the late-answer window). Built as an `http::Request` in
    /// place: ureq's request builder moves the whole request through every
    /// header it adds, a cost on every telegram.
    fn request<S: ureq::AsSendBody>(
        &self,
        agent: &ureq::Agent,
        method: Method,
        body: S,
    ) -> Result<Request<S>, ureq::Error> {
        let mut req = Request::new(body);
        // Room for every header the request carries, ureq's included: grown
        // from empty, the map moves and rehashes twice per request.
        *req.headers_mut() = HeaderMap::with_capacity(REQUEST_HEADERS);
        *req.method_mut() = method;
        *req.uri_mut() = match &self.uri {
            Ok(uri) => uri.clone(),
            Err(url) => Uri::try_from(url.as_str()).map_err(ureq::http::Error::from)?,
        };
        let headers = req.headers_mut();
        // What ureq adds to a request that lacks them, each made anew per
        // request there; here from values made once.
        if let Some(host) = &self.host {
            headers.insert(HOST, host.clone());
        }
        headers.insert(USER_AGENT, HeaderValue::from_static(USER_AGENT_TEXT));
        headers.insert(ACCEPT, HeaderValue::from_static("*/*"));
        headers.insert(DEADLINE_NAME, HeaderValue::from(self.remaining_ms));
        headers.insert(
            TRACEPARENT_NAME,
            HeaderValue::try_from(self.trace.traceparent()).map_err(ureq::http::Error::from)?,
        );
        if let Some(a) = &self.auth {
            let value = HeaderValue::try_from(a.as_str()).map_err(ureq::http::Error::from)?;
            headers.insert(AUTHORIZATION, value);
        }
        if let CoreRequest::Transfer { guid, .. } = &self.request {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            let value = HeaderValue::try_from(&**guid).map_err(ureq::http::Error::from)?;
            headers.insert(GUID_NAME, value);
        }
        Ok(agent
            .configure_request(req)
            .timeout_resolve(Some(self.connect))
            .timeout_connect(Some(self.connect))
            .timeout_global(Some(self.call_limit))
            .build())
    }

    fn exchange(&self) -> Result<HttpAnswer, ureq::Error> {
        let agent = this_threads_agent(&self.agents);
        let mut response = match &self.request {
            CoreRequest::Transfer { json, .. } => {
                agent.run(self.request(agent, Method::POST, &json[..])?)?
            }
            CoreRequest::Inquiry { .. } => agent.run(self.request(agent, Method::GET, ())?)?,
        };
        let status = response.status().as_u16();
        // By `HeaderName`: a `&str` name is parsed on every look-up.
        let header = |name: &HeaderName| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let retry_after = header(&RETRY_AFTER);
        let replayed = header(&REPLAYED_NAME).is_some_and(|v| v.eq_ignore_ascii_case("true"));
        // Read into room for the whole answer when its length is given
        // (ureq's `read_to_vec` grows its buffer from nothing, two
        // allocations and copies per answer); the limit holds either way.
        let room = response
            .body()
            .content_length()
            .map_or(0, |n| n.min(MAX_BODY) as usize);
        let mut body = Vec::with_capacity(room);
        std::io::Read::read_to_end(
            &mut response.body_mut().with_config().limit(MAX_BODY).reader(),
            &mut body,
        )?;
        Ok(HttpAnswer {
            status,
            body,
            retry_after,
            replayed,
        })
    }
}

/// A short, credential-free description of a ureq error for logs and the journal.
fn describe(e: &ureq::Error) -> String {
    if let Some(h) = tls::handshake_error(e) {
        return h.to_string();
    }
    match e {
        ureq::Error::Timeout(t) => format!("timeout ({t})"),
        ureq::Error::Io(io) => format!("i/o: {io}"),
        ureq::Error::HostNotFound => "host not found".into(),
        ureq::Error::ConnectionFailed => "connection failed".into(),
        // ureq's words ("larger than request limit") would blame the request.
        ureq::Error::BodyExceedsLimit(limit) => {
            format!("the core's answer body is larger than the hub reads ({limit} bytes)")
        }
        other => other.to_string(),
    }
}

/// The longest wait [`parse_retry_after`] returns. Far above any budget (a wait
/// past the budget is never started), and small enough that adding it to any
/// clock reading cannot overflow.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 60 * 60);

/// Parses `Retry-After` (delay-seconds or an HTTP-date) into a wait from now,
/// at most [`MAX_RETRY_AFTER`]: a core may ask for any number of seconds (more
/// digits than a u64 holds included) or name a date in the year 9999.
pub fn parse_retry_after(value: &str) -> Option<Duration> {
    let v = value.trim();
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
        // Too many digits for a u64 is still "a very long time".
        let secs = v.parse::<u64>().unwrap_or(u64::MAX);
        return Some(Duration::from_secs(secs).min(MAX_RETRY_AFTER));
    }
    let when = httpdate::parse_http_date(v).ok()?;
    Some(
        when.duration_since(std::time::SystemTime::now())
            .unwrap_or(Duration::ZERO)
            .min(MAX_RETRY_AFTER),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gate_sent_wins_over_abandon() {
        let g = SendGate::new(None);
        assert!(g.start());
        assert!(g.pass());
        assert_eq!(g.abandon(), SENT);
        assert!(g.pass(), "a sent call keeps writing");
    }

    #[test]
    fn gate_abandon_wins_over_send() {
        let g = SendGate::new(None);
        assert!(g.start());
        assert_eq!(g.abandon(), CONNECTING);
        assert!(!g.pass(), "nothing may be written after abandoning");
        assert!(!g.was_sent());
    }

    #[test]
    fn gate_abandoned_in_queue_never_starts() {
        let g = SendGate::new(None);
        assert_eq!(g.abandon(), QUEUED);
        assert!(!g.start());
    }

    #[test]
    fn the_header_names_made_once_are_the_documented_ones() {
        for (made, documented) in [
            (DEADLINE_NAME, DEADLINE_HEADER),
            (TRACEPARENT_NAME, TRACEPARENT_HEADER),
            (GUID_NAME, "X-GUID"),
        ] {
            assert_eq!(made, HeaderName::from_bytes(documented.as_bytes()).unwrap());
        }
    }

    #[test]
    fn a_trace_ids_text_is_its_32_hex_digits() {
        for id in [
            1u128,
            0x0af7651916cd43dd8448eb211c80319c,
            u128::MAX,
            0xf << 124,
        ] {
            assert_eq!(TraceId(id).text().to_string(), format!("{id:032x}"));
            assert_eq!(TraceId(id).to_string(), format!("{id:032x}"));
        }
    }

    #[test]
    fn traceparent_is_w3c_shaped() {
        let t = TraceId(0x0af7651916cd43dd8448eb211c80319c);
        let v = t.traceparent();
        let parts: Vec<&str> = v.split('-').collect();
        assert_eq!(parts.len(), 4, "{v}");
        assert_eq!(parts[0], "00");
        assert_eq!(parts[1], "0af7651916cd43dd8448eb211c80319c");
        assert_eq!(parts[2].len(), 16);
        assert_ne!(parts[2], "0000000000000000");
        assert_eq!(parts[3], "01");
        assert!(
            parts[2]
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
        assert_ne!(t.traceparent(), v, "each call has a span id of its own");
        assert_eq!(TraceId(1).to_string(), format!("{:032x}", 1));
    }

    /// A core that reads one request head, answers 200 and hands the head back.
    fn one_shot_core() -> (String, std::sync::mpsc::Receiver<String>) {
        use std::io::{BufRead, BufReader, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut head = String::new();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                head.push_str(&line);
            }
            let mut stream = stream;
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}");
            let _ = tx.send(head);
        });
        (url, rx)
    }

    #[test]
    fn a_thread_keeps_to_one_agent_and_threads_spread_over_them() {
        let target = Arc::new(
            Target::new(
                &TargetConfig::with_url("core", "http://127.0.0.1:9"),
                Duration::from_secs(1),
            )
            .unwrap(),
        );
        let index = |t: &Target| {
            let a = this_threads_agent(&t.agents) as *const ureq::Agent;
            t.agents.iter().position(|b| std::ptr::eq(a, b)).unwrap()
        };
        assert_eq!(index(&target), index(&target));
        let used: std::collections::HashSet<usize> = (0..AGENTS)
            .map(|_| {
                let t = target.clone();
                std::thread::spawn(move || index(&t)).join().unwrap()
            })
            .collect();
        // Consecutive threads take consecutive agents (other tests' threads
        // may take turns in between).
        assert!(used.len() > 1, "{used:?}");
    }

    /// A keep-alive core that answers 200 to each request once `round`
    /// requests of the current round have come in (so that they are all
    /// open at once): the base URL, and the connections accepted so far.
    fn keep_alive_core(round: usize) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        use std::io::{BufRead, BufReader, Write};
        use std::sync::{Condvar, Mutex};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let arrived = Arc::new((Mutex::new(0usize), Condvar::new()));
        let counted = accepted.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                counted.fetch_add(1, Ordering::SeqCst);
                let arrived = arrived.clone();
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(stream.try_clone().unwrap());
                    let mut stream = stream;
                    loop {
                        // A request head (the test sends GETs: no body).
                        let mut line = String::new();
                        loop {
                            line.clear();
                            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                                return;
                            }
                            if line == "\r\n" {
                                break;
                            }
                        }
                        let (count, all_in) = &*arrived;
                        let mut n = count.lock().unwrap();
                        *n += 1;
                        let this_round = n.div_ceil(round);
                        all_in.notify_all();
                        while *n < this_round * round {
                            n = all_in.wait(n).unwrap();
                        }
                        drop(n);
                        if stream
                            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
                            .is_err()
                        {
                            return;
                        }
                    }
                });
            }
        });
        (url, accepted)
    }

    /// Calls polled on one thread (the reactor's) run on caller threads,
    /// whose connections must find their way back to the pools those threads
    /// take from: a second round of as many calls at once reuses the first
    /// round's connections.
    #[tokio::test]
    async fn calls_polled_on_one_thread_reuse_their_pooled_connections() {
        const CALLS: usize = 8;
        let (url, accepted) = keep_alive_core(CALLS);
        let budget = Duration::from_secs(10);
        let mut cfg = TargetConfig::with_url("core", &url);
        // Two idle connections per agent: two of this test's caller threads
        // may share an agent when other tests' threads take the shards in
        // between, and then both of their connections are still kept.
        cfg.max_concurrency = 2 * AGENTS;
        let target = Arc::new(Target::new(&cfg, budget).unwrap());
        let round = || async {
            let calls: Vec<_> = (0..CALLS)
                .map(|_| {
                    let target = target.clone();
                    tokio::spawn(async move {
                        let inquiry = CoreRequest::Inquiry { guid: "G1".into() };
                        target.attempt(&inquiry, 0, Instant::now() + budget).await
                    })
                })
                .collect();
            for call in calls {
                let end = call.await.unwrap();
                assert!(matches!(end, CallEnd::Done(Ok(ref a)) if a.status == 200));
            }
        };
        round().await;
        let first = accepted.load(Ordering::SeqCst);
        assert_eq!(first, CALLS, "one connection per call at once");
        round().await;
        let opened = accepted.load(Ordering::SeqCst) - first;
        // Three caller threads may share an agent, and then one of their
        // connections is not kept.
        assert!(
            opened < CALLS / 2,
            "{opened} of {CALLS} calls opened a new connection instead of reusing a pooled one"
        );
    }

    /// The `Host` made once per URL is what ureq would make per request:
    /// the port only when it is not the scheme's default.
    #[test]
    fn the_host_header_is_the_host_with_a_port_only_when_not_the_default() {
        for (url, host) in [
            ("http://127.0.0.1:8080/v1/transfers", "127.0.0.1:8080"),
            ("http://core.bank.example/v1/transfers", "core.bank.example"),
            (
                "http://core.bank.example:80/v1/transfers",
                "core.bank.example",
            ),
            (
                "https://core.bank.example:443/v1/transfers",
                "core.bank.example",
            ),
            (
                "https://core.bank.example:8443/v1/transfers",
                "core.bank.example:8443",
            ),
            (
                "https://core.bank.example:80/v1/transfers",
                "core.bank.example:80",
            ),
            ("http://[::1]:9000/v1/transfers", "[::1]:9000"),
        ] {
            let uri = Uri::try_from(url).unwrap();
            assert_eq!(host_header(&uri).unwrap(), host, "{url}");
        }
    }

    /// A transfer's request carries one `Host`, `User-Agent` and `Accept`
    /// each, as ureq wrote them when it made them itself.
    #[tokio::test]
    async fn a_transfer_carries_one_host_user_agent_and_accept() {
        let (url, head) = one_shot_core();
        let budget = Duration::from_secs(5);
        let target = Target::new(&TargetConfig::with_url("core", &url), budget).unwrap();
        let request = CoreRequest::Transfer {
            guid: "G1".into(),
            json: Arc::from(&b"{}"[..]),
        };
        let end = target.attempt(&request, 0, Instant::now() + budget).await;
        assert!(matches!(end, CallEnd::Done(Ok(ref a)) if a.status == 200));
        let head = head.recv_timeout(budget).unwrap().to_ascii_lowercase();
        let authority = url.trim_start_matches("http://");
        for expected in [
            format!("host: {authority}"),
            format!("user-agent: relayhub/{}", env!("CARGO_PKG_VERSION")),
            "accept: */*".to_string(),
        ] {
            let name = expected.split(':').next().unwrap();
            let lines: Vec<&str> = head
                .lines()
                .filter(|l| l.starts_with(&format!("{name}:")))
                .collect();
            assert_eq!(lines, [expected.as_str()], "in:\n{head}");
        }
    }

    #[tokio::test]
    async fn a_call_carries_the_telegrams_trace_id() {
        let (url, head) = one_shot_core();
        let budget = Duration::from_secs(5);
        let target = Target::new(&TargetConfig::with_url("core", &url), budget).unwrap();
        let trace = TraceId(0x4bf92f3577b34da6a3ce929d0e0e4736);
        let request = CoreRequest::Inquiry { guid: "G1".into() };
        let end = trace
            .scope(target.attempt(&request, 0, Instant::now() + budget))
            .await;
        assert!(matches!(end, CallEnd::Done(Ok(ref a)) if a.status == 200));
        let head = head.recv_timeout(budget).unwrap().to_ascii_lowercase();
        let line = head
            .lines()
            .find(|l| l.starts_with("traceparent: "))
            .unwrap_or_else(|| panic!("no traceparent in:\n{head}"));
        assert!(
            line.starts_with("traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-"),
            "{line}"
        );
    }

    #[test]
    fn a_refused_licence_closes_the_gate_at_the_first_byte() {
        let open = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let flag = open.clone();
        let licence: SendLicence = Arc::new(move || {
            if flag.load(Ordering::SeqCst) {
                Ok(())
            } else {
                Err("fenced".into())
            }
        });
        let g = SendGate::new(Some(licence.clone()));
        assert!(g.start());
        open.store(false, Ordering::SeqCst);
        assert!(!g.pass(), "no first byte without the licence");
        assert!(!g.was_sent());
        assert_eq!(g.refused(), Some("fenced"));
        assert_eq!(g.abandon(), REFUSED, "a refused call is not pending");
        // Once sent, the licence is not asked again: the request goes on whole.
        let g = SendGate::new(Some(licence));
        assert!(g.start());
        open.store(true, Ordering::SeqCst);
        assert!(g.pass());
        open.store(false, Ordering::SeqCst);
        assert!(g.pass());
    }

    #[tokio::test]
    async fn a_transfer_without_the_licence_sends_nothing_and_is_no_capacity() {
        let (url, head) = one_shot_core();
        let budget = Duration::from_secs(5);
        let target = Target::new(&TargetConfig::with_url("core", &url), budget).unwrap();
        target.require_licence(Arc::new(|| Err("this hub is fenced".into())));
        let transfer = CoreRequest::Transfer {
            guid: "G1".into(),
            json: Arc::from(&b"{}"[..]),
        };
        let end = target.attempt(&transfer, 0, Instant::now() + budget).await;
        match end {
            CallEnd::Done(Err(CallFailure::NoCapacity(why))) => {
                assert!(why.contains("fenced"), "{why}")
            }
            CallEnd::Done(other) => panic!("expected NoCapacity, got {other:?}"),
            CallEnd::Pending(_) => panic!("expected NoCapacity, got a pending call"),
        }
        // The core saw a connection but not one request byte; an inquiry (a
        // GET, always safe) needs no licence.
        assert_eq!(head.recv_timeout(budget).unwrap(), "");
        let (url, head) = one_shot_core();
        let target = Target::new(&TargetConfig::with_url("core", &url), budget).unwrap();
        target.require_licence(Arc::new(|| Err("this hub is fenced".into())));
        let inquiry = CoreRequest::Inquiry { guid: "G1".into() };
        let end = target.attempt(&inquiry, 0, Instant::now() + budget).await;
        assert!(matches!(end, CallEnd::Done(Ok(ref a)) if a.status == 200));
        assert!(head.recv_timeout(budget).unwrap().starts_with("GET "));
    }

    #[test]
    fn retry_after_both_forms() {
        assert_eq!(parse_retry_after("2"), Some(Duration::from_secs(2)));
        let later = std::time::SystemTime::now() + Duration::from_secs(30);
        let d = parse_retry_after(&httpdate::fmt_http_date(later)).unwrap();
        assert!(
            d > Duration::from_secs(28) && d <= Duration::from_secs(30),
            "{d:?}"
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after("soon"), None);
        assert_eq!(parse_retry_after(""), None);
        assert_eq!(parse_retry_after("-1"), None);
    }

    /// A wait the hub may add to its clock without overflowing.
    fn addable(d: Duration) -> bool {
        d <= MAX_RETRY_AFTER
            && Instant::now().checked_add(d).is_some()
            && std::time::SystemTime::now().checked_add(d).is_some()
    }

    #[test]
    fn retry_after_extremes_stay_addable_to_the_clock() {
        for v in [
            "10000000000000000000",
            "18446744073709551615",
            "18446744073709551616",
            "99999999999999999999999999999999999999",
            "Fri, 31 Dec 9999 23:59:59 GMT",
        ] {
            let d = parse_retry_after(v).unwrap_or_else(|| panic!("{v}: not read"));
            assert_eq!(d, MAX_RETRY_AFTER, "{v}");
            assert!(addable(d), "{v}: {d:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn any_delay_seconds_is_capped(secs in proptest::num::u64::ANY) {
            let d = parse_retry_after(&secs.to_string()).unwrap();
            proptest::prop_assert_eq!(d, Duration::from_secs(secs).min(MAX_RETRY_AFTER));
            proptest::prop_assert!(addable(d));
        }

        #[test]
        fn any_digit_string_is_capped(digits in "[0-9]{1,60}") {
            let d = parse_retry_after(&digits).unwrap();
            proptest::prop_assert!(addable(d));
        }

        #[test]
        fn any_http_date_is_capped(secs in 0u64..253_402_300_799) {
            // Every second from 1970 to the end of year 9999.
            let when = std::time::UNIX_EPOCH + Duration::from_secs(secs);
            let d = parse_retry_after(&httpdate::fmt_http_date(when)).unwrap();
            proptest::prop_assert!(addable(d));
        }
    }
}
