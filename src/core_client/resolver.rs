//! Core host names resolved ahead of the calls, never on a thread per call.
//!
//! ureq's `DefaultResolver` runs every lookup that has a timeout on a new
//! thread, and every call the hub makes has one: a name in a core URL cost a
//! thread spawn per telegram. [`CachedResolver`] answers IP literals itself and
//! names from a cache that a thread of the target's own fills when the target is
//! built (at start and on every reload) and refreshes every
//! `resolve_refresh_ms`:
//!
//! * a call that comes before the first lookup has ended waits for it, at most
//!   its resolve timeout;
//! * a name that never resolved is `HostNotFound`, so the call fails before any
//!   byte is written: "not sent", E902, as before;
//! * a refresh that fails keeps the addresses of the last one that worked (a
//!   DNS outage does not stop the hub from reaching a core that is up), and says
//!   so once, as an error;
//! * all addresses of a name are handed to ureq, whose connector tries them in
//!   turn when a connect fails; no byte has been written then, so a failover
//!   across the addresses is still "not sent".

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ureq::unversioned::resolver::{ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::NextTimeout;

/// How one name is looked up: the system's resolver, or a test's.
pub(crate) type Lookup = dyn Fn(&str, u16) -> std::io::Result<Vec<SocketAddr>> + Send + Sync;

/// The system's resolver (`getaddrinfo`), on the calling thread.
fn system_lookup(host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
    Ok((host, port).to_socket_addrs()?.collect())
}

/// Stack of the refresher thread: `getaddrinfo` (NSS modules included) needs
/// more than a socket wait, far less than the 2 MiB default.
const REFRESHER_STACK: usize = 256 * 1024;

/// What is known of one name.
#[derive(Debug, Clone)]
enum State {
    /// The first lookup has not ended yet.
    Pending,
    /// The addresses of the last lookup that found any.
    Resolved(Arc<[SocketAddr]>),
    /// No lookup found an address yet; the last one's error.
    Failed(String),
}

#[derive(Debug)]
struct Entry {
    host: String,
    port: u16,
    state: State,
    /// The last refresh of a resolved name failed (said once, until it works again).
    refresh_failing: bool,
}

/// The names of one target and what they resolve to.
struct Cache {
    entries: Mutex<Vec<Entry>>,
    /// Signalled after every round of lookups.
    changed: Condvar,
    /// Rounds of lookups done.
    rounds: Mutex<u64>,
    lookup: Box<Lookup>,
    target: String,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Cache {
    /// One round: looks every name up again and stores what was found.
    fn refresh(&self) {
        let names: Vec<(String, u16)> = lock(&self.entries)
            .iter()
            .map(|e| (e.host.clone(), e.port))
            .collect();
        for (host, port) in names {
            let found = (self.lookup)(&host, port);
            let mut entries = lock(&self.entries);
            let Some(e) = entries
                .iter_mut()
                .find(|e| e.host == host && e.port == port)
            else {
                continue;
            };
            match found {
                Ok(addrs) if !addrs.is_empty() => {
                    let addrs: Arc<[SocketAddr]> = addrs.into();
                    let same = matches!(&e.state, State::Resolved(old) if *old == addrs);
                    if !same {
                        tracing::info!(
                            target_name = %self.target,
                            host = %host,
                            addresses = ?addrs,
                            "core host name resolved"
                        );
                    }
                    if e.refresh_failing {
                        tracing::info!(target_name = %self.target, host = %host, "core host name resolves again");
                    }
                    e.state = State::Resolved(addrs);
                    e.refresh_failing = false;
                }
                other => {
                    let why = match other {
                        Ok(_) => "no address".to_string(),
                        Err(err) => err.to_string(),
                    };
                    match &e.state {
                        State::Resolved(_) => {
                            if !e.refresh_failing {
                                tracing::error!(
                                    target_name = %self.target,
                                    host = %host,
                                    error = %why,
                                    "core host name no longer resolves; the last addresses stay in use"
                                );
                            }
                            e.refresh_failing = true;
                        }
                        State::Pending | State::Failed(_) => {
                            if matches!(e.state, State::Pending) {
                                tracing::error!(
                                    target_name = %self.target,
                                    host = %host,
                                    error = %why,
                                    "core host name does not resolve: its calls fail as not sent (E902) until it does"
                                );
                            }
                            e.state = State::Failed(why);
                        }
                    }
                }
            }
        }
        *lock(&self.rounds) += 1;
        self.changed.notify_all();
    }

    /// The state of `host:port`, waiting until `until` while its first lookup runs.
    fn get(&self, host: &str, port: u16, until: Option<Instant>) -> Option<State> {
        let find = |entries: &[Entry]| {
            entries
                .iter()
                .find(|e| e.host == host && e.port == port)
                .map(|e| e.state.clone())
        };
        let state = find(&lock(&self.entries))?;
        if !matches!(state, State::Pending) {
            return Some(state);
        }
        let mut rounds = lock(&self.rounds);
        loop {
            let state = find(&lock(&self.entries))?;
            if !matches!(state, State::Pending) {
                return Some(state);
            }
            let wait = match until {
                Some(t) => match t.checked_duration_since(Instant::now()) {
                    Some(d) if !d.is_zero() => d,
                    _ => return Some(State::Pending),
                },
                None => Duration::from_secs(3600),
            };
            rounds = self
                .changed
                .wait_timeout(rounds, wait)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }
}

/// A resolver for one target's URLs: IP literals answered at once, names from
/// a cache refreshed in the background. Dropping it stops the refresher.
/// Clones share the cache and the refresher (the target's agents hold one
/// each); the refresher ends when the last is dropped.
#[derive(Debug, Clone)]
pub(crate) struct CachedResolver {
    cache: Arc<Cache>,
    /// The target's URLs' hosts and ports, read once (see [`Known`]).
    known: Arc<[Known]>,
    /// Dropped with the last clone of the resolver; the refresher then ends.
    _stop: Option<Arc<Sender<()>>>,
}

/// A configured URL's host and port, read from its authority once: `Uri`
/// parses the authority again on every `host()` and `port_u16()`, about a
/// thousand instructions per call.
#[derive(Debug)]
struct Known {
    scheme: String,
    authority: String,
    host: String,
    port: u16,
    /// The address, when the host is an IP literal.
    literal: Option<SocketAddr>,
}

/// The host (brackets of an IPv6 literal removed) and port of a URI.
fn host_port(uri: &ureq::http::Uri) -> Option<(&str, u16)> {
    let host = uri.host()?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = uri.port_u16().or_else(|| match uri.scheme_str() {
        Some("https") => Some(443),
        Some("http") => Some(80),
        _ => None,
    })?;
    Some((host, port))
}

impl CachedResolver {
    /// A resolver for `urls`, its names looked up now on a thread of its own
    /// and again every `refresh` (none is started when every host is an IP).
    pub(crate) fn start(target: &str, urls: &[String], refresh: Duration) -> CachedResolver {
        Self::with_lookup(target, urls, refresh, Box::new(system_lookup))
    }

    pub(crate) fn with_lookup(
        target: &str,
        urls: &[String],
        refresh: Duration,
        lookup: Box<Lookup>,
    ) -> CachedResolver {
        let mut entries: Vec<Entry> = Vec::new();
        let mut known: Vec<Known> = Vec::new();
        for url in urls {
            let Ok(uri) = url.parse::<ureq::http::Uri>() else {
                continue;
            };
            let Some((host, port)) = host_port(&uri) else {
                continue;
            };
            let literal = host
                .parse::<IpAddr>()
                .ok()
                .map(|ip| SocketAddr::new(ip, port));
            if let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) {
                known.push(Known {
                    scheme: scheme.to_string(),
                    authority: authority.as_str().to_string(),
                    host: host.to_string(),
                    port,
                    literal,
                });
            }
            if literal.is_some() || entries.iter().any(|e| e.host == host && e.port == port) {
                continue;
            }
            entries.push(Entry {
                host: host.to_string(),
                port,
                state: State::Pending,
                refresh_failing: false,
            });
        }
        let names = !entries.is_empty();
        let cache = Arc::new(Cache {
            entries: Mutex::new(entries),
            changed: Condvar::new(),
            rounds: Mutex::new(0),
            lookup,
            target: target.to_string(),
        });
        let stop = names.then(|| {
            let (tx, rx) = std::sync::mpsc::channel();
            let c = cache.clone();
            let spawned = std::thread::Builder::new()
                .name("relayhub-resolve".into())
                .stack_size(REFRESHER_STACK)
                .spawn(move || refresher(&c, &rx, refresh));
            if let Err(e) = spawned {
                // Without the thread the names are looked up once, here.
                tracing::error!(target_name = %target, error = %e, "cannot start the resolver thread; names are resolved once");
                cache.refresh();
            }
            tx
        });
        CachedResolver {
            cache,
            known: known.into(),
            _stop: stop.map(Arc::new),
        }
    }

    /// Rounds of lookups done so far.
    #[cfg(test)]
    pub(crate) fn rounds(&self) -> u64 {
        *lock(&self.cache.rounds)
    }

    /// Waits until more than `seen` rounds are done (false after `timeout`).
    #[cfg(test)]
    pub(crate) fn wait_rounds(&self, seen: u64, timeout: Duration) -> bool {
        let until = Instant::now() + timeout;
        let mut rounds = lock(&self.cache.rounds);
        while *rounds <= seen {
            let Some(left) = until.checked_duration_since(Instant::now()) else {
                return false;
            };
            rounds = self.cache.changed.wait_timeout(rounds, left).unwrap().0;
        }
        true
    }

    /// The addresses of `host:port` as a call would get them.
    fn addresses(
        &self,
        host: &str,
        port: u16,
        until: Option<Instant>,
    ) -> Result<Vec<SocketAddr>, ureq::Error> {
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(vec![SocketAddr::new(ip, port)]);
        }
        match self.cache.get(host, port, until) {
            Some(State::Resolved(addrs)) => Ok(addrs.to_vec()),
            Some(State::Failed(why)) => Err(ureq::Error::Io(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("host {host} not found: {why}"),
            ))),
            Some(State::Pending) => Err(ureq::Error::Timeout(ureq::Timeout::Resolve)),
            // Not one of the target's URLs (never the case for the hub's own
            // calls): asked on this thread, without a thread of its own.
            None => system_lookup(host, port).map_err(ureq::Error::Io),
        }
    }
}

fn refresher(cache: &Cache, stop: &Receiver<()>, every: Duration) {
    loop {
        cache.refresh();
        match stop.recv_timeout(every) {
            Err(RecvTimeoutError::Timeout) => continue,
            // The target was dropped (reload, shutdown).
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

impl Resolver for CachedResolver {
    fn resolve(
        &self,
        uri: &ureq::http::Uri,
        _config: &ureq::config::Config,
        timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let known = self.known.iter().find(|k| {
            uri.scheme_str() == Some(k.scheme.as_str())
                && uri.authority().map(|a| a.as_str()) == Some(k.authority.as_str())
        });
        if let Some(addr) = known.and_then(|k| k.literal) {
            let mut out = self.empty();
            out.push(addr);
            return Ok(out);
        }
        let (host, port) = match known {
            Some(k) => (k.host.as_str(), k.port),
            None => host_port(uri)
                .ok_or_else(|| ureq::Error::BadUri(format!("no host or port: {uri}")))?,
        };
        let until = if timeout.after.is_not_happening() {
            None
        } else {
            Instant::now().checked_add(*timeout.after)
        };
        let found = self.addresses(host, port, until).map_err(|e| match e {
            ureq::Error::Timeout(_) => ureq::Error::Timeout(timeout.reason),
            e => e,
        })?;
        let mut out = self.empty();
        for a in found.into_iter().take(16) {
            out.push(a);
        }
        if out.is_empty() {
            return Err(ureq::Error::HostNotFound);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// A lookup answering from a list the test changes, counting its calls.
    fn scripted(answer: Arc<Mutex<std::io::Result<Vec<SocketAddr>>>>) -> Box<Lookup> {
        Box::new(move |_host, _port| match &*lock(&answer) {
            Ok(v) => Ok(v.clone()),
            Err(e) => Err(std::io::Error::new(e.kind(), e.to_string())),
        })
    }

    #[test]
    fn a_refresh_replaces_the_cached_addresses() {
        let answer = Arc::new(Mutex::new(Ok(vec![addr("10.0.0.1:8080")])));
        let r = CachedResolver::with_lookup(
            "core",
            &["http://core.example:8080".into()],
            Duration::from_millis(20),
            scripted(answer.clone()),
        );
        assert!(r.wait_rounds(0, Duration::from_secs(10)));
        assert_eq!(
            r.addresses("core.example", 8080, None).unwrap(),
            vec![addr("10.0.0.1:8080")]
        );
        *lock(&answer) = Ok(vec![addr("10.0.0.2:8080"), addr("10.0.0.3:8080")]);
        // The next round that starts after the change sees it.
        let seen = r.rounds();
        assert!(r.wait_rounds(seen + 1, Duration::from_secs(10)));
        assert_eq!(
            r.addresses("core.example", 8080, None).unwrap(),
            vec![addr("10.0.0.2:8080"), addr("10.0.0.3:8080")]
        );
        // A refresh that fails keeps the last addresses.
        *lock(&answer) = Err(std::io::Error::other("dns down"));
        let seen = r.rounds();
        assert!(r.wait_rounds(seen + 1, Duration::from_secs(10)));
        assert_eq!(
            r.addresses("core.example", 8080, None).unwrap(),
            vec![addr("10.0.0.2:8080"), addr("10.0.0.3:8080")]
        );
    }

    #[test]
    fn a_name_that_never_resolved_is_host_not_found() {
        let answer = Arc::new(Mutex::new(Err(std::io::Error::other("NXDOMAIN"))));
        let r = CachedResolver::with_lookup(
            "core",
            &["http://nowhere.invalid:80".into()],
            Duration::from_secs(3600),
            scripted(answer),
        );
        assert!(r.wait_rounds(0, Duration::from_secs(10)));
        assert!(matches!(
            r.addresses("nowhere.invalid", 80, None),
            Err(ureq::Error::Io(e)) if e.to_string().contains("NXDOMAIN")
        ));
    }

    #[test]
    fn a_call_before_the_first_lookup_waits_for_it() {
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let go_rx = Mutex::new(go_rx);
        let lookup: Box<Lookup> = Box::new(move |_, port| {
            let _ = lock(&go_rx).recv();
            Ok(vec![SocketAddr::new([10, 0, 0, 9].into(), port)])
        });
        let r = CachedResolver::with_lookup(
            "core",
            &["http://slow.example:81".into()],
            Duration::from_secs(3600),
            lookup,
        );
        // Still pending: a short wait ends as a resolve timeout.
        assert!(matches!(
            r.addresses("slow.example", 81, Some(Instant::now())),
            Err(ureq::Error::Timeout(_))
        ));
        go_tx.send(()).unwrap();
        assert_eq!(
            r.addresses("slow.example", 81, None).unwrap(),
            vec![addr("10.0.0.9:81")]
        );
    }

    #[test]
    fn ip_literals_start_no_thread_and_need_no_lookup() {
        let lookup: Box<Lookup> = Box::new(|_, _| panic!("an IP literal was looked up"));
        let r = CachedResolver::with_lookup(
            "core",
            &["http://127.0.0.1:9".into(), "http://[::1]:9".into()],
            Duration::from_millis(1),
            lookup,
        );
        assert!(r._stop.is_none());
        assert_eq!(
            r.addresses("127.0.0.1", 9, None).unwrap(),
            vec![addr("127.0.0.1:9")]
        );
        assert_eq!(r.addresses("::1", 9, None).unwrap(), vec![addr("[::1]:9")]);
    }

    /// What a call gets for `uri`, through ureq's resolver interface.
    fn resolved(r: &CachedResolver, uri: &str) -> Result<Vec<SocketAddr>, String> {
        let config = ureq::config::Config::default();
        r.resolve(&uri.parse().unwrap(), &config, NextTimeout::default())
            .map(|found| found.iter().copied().collect())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_call_gets_the_address_of_its_urls_authority() {
        let answer = Arc::new(Mutex::new(Ok(vec![addr("10.0.0.7:8080")])));
        let lookups = Arc::new(Mutex::new(0));
        let counted = lookups.clone();
        let scripted = scripted(answer);
        let lookup: Box<Lookup> = Box::new(move |host, port| {
            *lock(&counted) += 1;
            scripted(host, port)
        });
        let r = CachedResolver::with_lookup(
            "core",
            &[
                "http://127.0.0.1:9/v1/transfers".into(),
                "http://[::1]:9".into(),
                "http://core.bank:8080".into(),
            ],
            Duration::from_secs(3600),
            lookup,
        );
        assert!(r.wait_rounds(0, Duration::from_secs(10)));
        // The configured literals, whatever the path (an inquiry's URL).
        assert_eq!(
            resolved(&r, "http://127.0.0.1:9/v1/transfers/G1"),
            Ok(vec![addr("127.0.0.1:9")])
        );
        assert_eq!(resolved(&r, "http://[::1]:9/"), Ok(vec![addr("[::1]:9")]));
        // A name from the cache, with no lookup of its own.
        let before = *lock(&lookups);
        assert_eq!(
            resolved(&r, "http://core.bank:8080/v1/transfers"),
            Ok(vec![addr("10.0.0.7:8080")])
        );
        assert_eq!(*lock(&lookups), before);
        // Not one of the target's URLs: read from the URI itself.
        assert_eq!(
            resolved(&r, "http://127.0.0.2:10/"),
            Ok(vec![addr("127.0.0.2:10")])
        );
        assert_eq!(
            resolved(&r, "http://127.0.0.1/"),
            Ok(vec![addr("127.0.0.1:80")])
        );
    }

    #[test]
    fn the_refresher_ends_with_the_last_clone() {
        let lookup: Box<Lookup> = Box::new(|_, _| Ok(vec![addr("10.0.0.1:80")]));
        let r = CachedResolver::with_lookup(
            "core",
            &["http://core.example".into()],
            Duration::from_millis(1),
            lookup,
        );
        // The refresher returns when its channel's sender is gone.
        let stop = Arc::downgrade(r._stop.as_ref().expect("a name starts a refresher"));
        let clone = r.clone();
        drop(r);
        assert!(stop.upgrade().is_some(), "stopped while a clone is left");
        drop(clone);
        assert!(stop.upgrade().is_none(), "the refresher still runs");
    }
}
