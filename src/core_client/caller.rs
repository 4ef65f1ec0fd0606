//! The threads that make a target's core calls.
//!
//! ureq is synchronous: a call needs a thread that blocks on its socket. The
//! hub used tokio's blocking pool, whose hand-off (a shared queue under a
//! mutex, a condition variable that wakes whichever thread slept first, a task
//! allocation per call) was most of the hub's CPU per telegram. [`Callers`]
//! is a pool of plain threads owned by one target instead:
//!
//! * a call goes straight to one idle thread: the one that went idle *last*
//!   (LIFO), whose stack and caches are warm, while the threads at the bottom
//!   of the stack stay asleep and end after [`KEEP_IDLE`];
//! * a thread sleeps as soon as it is idle: spinning before sleeping (5, 20
//!   and 200 µs were measured) cost more CPU per telegram than the wake-ups
//!   it saved, on a machine where the hub shares its cores with the core and
//!   the channels (docs/performance.md);
//! * no idle thread: a new one is started for the call (the bulkhead bounds
//!   how many calls, hence threads, there are at once);
//! * the threads only block on sockets, so their stacks are small
//!   ([`STACK_SIZE`]).
//!
//! A call made while a connection's own thread polls its telegram (a busy
//! plain-TCP connection adopted by a thread, `server/adoption.rs`) is not
//! handed to a pool thread at all: it is left in that thread's stash
//! ([`crate::stash`]), and the thread runs it itself right after the poll, as a
//! pool thread would, with no wake-up on either side.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// Stack of a caller thread. A plain HTTP call (ureq, 16 KiB buffers on the
/// heap, the gate, a log line) touches ~28 KB of it. A TLS handshake (rustls
/// on ring) overflows 128 KiB in a debug build and fits in 160 KiB
/// (`a_tls_exchange_fits_a_caller_threads_stack`); 256 KiB keeps a margin. Only
/// the pages a call touches are resident.
pub(crate) const STACK_SIZE: usize = 256 * 1024;

/// An idle thread ends after this long without a call.
pub(crate) const KEEP_IDLE: Duration = Duration::from_secs(10);

/// One call to make on a caller thread.
pub(crate) use crate::stash::Work;

/// A thread's mailbox: the next call, and whether one is there.
struct Slot {
    work: Mutex<Option<Work>>,
    full: AtomicBool,
    thread: Thread,
}

struct Shared {
    /// Idle threads, the last to go idle on top.
    idle: Mutex<Vec<Arc<Slot>>>,
    /// Threads alive.
    threads: AtomicUsize,
    /// The pool is gone: idle threads end now.
    closed: AtomicBool,
    name: String,
    stack: usize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A target's caller threads. Dropping it lets the idle ones end; a thread
/// that is making a call (a late transfer) finishes it first.
pub(crate) struct Callers {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Callers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Callers")
            .field("name", &self.shared.name)
            .field("threads", &self.threads())
            .finish_non_exhaustive()
    }
}

impl Callers {
    /// A pool whose threads are named `name`; none is started yet.
    pub(crate) fn new(name: &str) -> Callers {
        Callers::with_stack(name, STACK_SIZE)
    }

    /// The same with threads of `stack` bytes of stack.
    pub(crate) fn with_stack(name: &str, stack: usize) -> Callers {
        Callers {
            shared: Arc::new(Shared {
                idle: Mutex::new(Vec::new()),
                threads: AtomicUsize::new(0),
                closed: AtomicBool::new(false),
                name: name.to_string(),
                stack,
            }),
        }
    }

    /// Threads alive (idle or calling).
    pub(crate) fn threads(&self) -> usize {
        self.shared.threads.load(Ordering::Relaxed)
    }

    /// Runs `work` on an idle thread, or on a new one; or leaves it in this
    /// thread's stash when one is open ([`crate::stash`]), for a caller that
    /// waits for it until `due`: `Ok(true)` then, the work runs on this
    /// thread right after the poll that asked for it. Fails, handing `work`
    /// back untouched, only when no thread can be started.
    pub(crate) fn run_or_stash(&self, work: Work, due: tokio::time::Instant) -> Result<bool, Work> {
        match crate::stash::stash_call(work, due) {
            None => Ok(true),
            Some(work) => self.run(work).map(|()| false),
        }
    }

    /// Runs `work` on an idle thread, or on a new one. Fails, handing `work`
    /// back untouched, only when no thread can be started.
    pub(crate) fn run(&self, work: Work) -> Result<(), Work> {
        let idle = lock(&self.shared.idle).pop();
        if let Some(slot) = idle {
            *lock(&slot.work) = Some(work);
            slot.full.store(true, Ordering::Release);
            slot.thread.unpark();
            return Ok(());
        }
        self.spawn(work)
    }

    fn spawn(&self, work: Work) -> Result<(), Work> {
        // The work travels through a cell so that a failed spawn can return it.
        let cell = Arc::new(Mutex::new(Some(work)));
        let inside = cell.clone();
        let shared = self.shared.clone();
        shared.threads.fetch_add(1, Ordering::Relaxed);
        let spawned = std::thread::Builder::new()
            .name(shared.name.clone())
            .stack_size(shared.stack)
            .spawn(move || {
                // Counted out however the thread ends (a call that panics
                // included: its caller then hears "ended without a result").
                let _alive = Alive(&shared.threads);
                let first = lock(&inside).take();
                drop(inside);
                if let Some(first) = first {
                    caller(&shared, first);
                }
            });
        match spawned {
            Ok(_) => Ok(()),
            Err(e) => {
                self.shared.threads.fetch_sub(1, Ordering::Relaxed);
                tracing::error!(error = %e, "cannot start a core caller thread");
                Err(lock(&cell)
                    .take()
                    .expect("the work of a thread that never ran"))
            }
        }
    }
}

/// Takes a thread off the count when dropped.
struct Alive<'a>(&'a AtomicUsize);

impl Drop for Alive<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Drop for Callers {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Release);
        // Each idle thread takes itself off the list (see `wait`).
        for slot in lock(&self.shared.idle).iter() {
            slot.thread.unpark();
        }
    }
}

/// A caller thread: the call it was started for, then whatever it is handed
/// while idle, until it has been idle for [`KEEP_IDLE`] or the pool is gone.
fn caller(shared: &Shared, first: Work) {
    first();
    let slot = Arc::new(Slot {
        work: Mutex::new(None),
        full: AtomicBool::new(false),
        thread: std::thread::current(),
    });
    loop {
        if shared.closed.load(Ordering::Acquire) {
            return;
        }
        lock(&shared.idle).push(slot.clone());
        if !wait(shared, &slot) {
            return;
        }
        slot.full.store(false, Ordering::Relaxed);
        let work = lock(&slot.work).take();
        if let Some(work) = work {
            work();
        }
    }
}

/// Waits for work in `slot`. False when the thread should end (idle too
/// long, or the pool is gone) and has left the idle list.
fn wait(shared: &Shared, slot: &Arc<Slot>) -> bool {
    let idle_until = Instant::now() + KEEP_IDLE;
    loop {
        if slot.full.load(Ordering::Acquire) {
            return true;
        }
        let now = Instant::now();
        if now >= idle_until || shared.closed.load(Ordering::Acquire) {
            let mut idle = lock(&shared.idle);
            if let Some(i) = idle.iter().position(|s| Arc::ptr_eq(s, slot)) {
                idle.swap_remove(i);
                return false;
            }
            // Taken off the list by a caller that is filling the slot now.
            drop(idle);
            while !slot.full.load(Ordering::Acquire) {
                std::thread::park();
            }
            return true;
        }
        std::thread::park_timeout(idle_until - now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::mpsc;

    #[test]
    fn calls_run_and_idle_threads_are_reused_last_in_first_out() {
        let pool = Callers::new("test-caller");
        let (tx, rx) = mpsc::channel();
        // Two calls at once need two threads.
        let (hold_tx, hold_rx) = mpsc::channel::<()>();
        let hold_rx = Arc::new(Mutex::new(hold_rx));
        for _ in 0..2 {
            let tx = tx.clone();
            let hold = hold_rx.clone();
            pool.run(Box::new(move || {
                tx.send(std::thread::current().id()).unwrap();
                let _ = lock(&hold).recv();
            }))
            .unwrap_or_else(|_| panic!("spawn"));
        }
        let a = rx.recv().unwrap();
        let b = rx.recv().unwrap();
        assert_ne!(a, b);
        assert_eq!(pool.threads(), 2);
        hold_tx.send(()).unwrap();
        hold_tx.send(()).unwrap();
        // Both idle again; the next calls run on them, no new thread.
        let deadline = Instant::now() + Duration::from_secs(10);
        while lock(&pool.shared.idle).len() < 2 {
            assert!(Instant::now() < deadline, "threads never went idle");
            std::thread::yield_now();
        }
        let top = lock(&pool.shared.idle).last().unwrap().thread.id();
        let tx2 = tx.clone();
        pool.run(Box::new(move || {
            tx2.send(std::thread::current().id()).unwrap()
        }))
        .unwrap_or_else(|_| panic!("run"));
        assert_eq!(
            rx.recv().unwrap(),
            top,
            "the last thread to go idle runs the call"
        );
        assert_eq!(pool.threads(), 2);
    }

    #[test]
    fn a_call_that_panics_ends_its_thread_only() {
        let pool = Callers::new("test-caller");
        pool.run(Box::new(|| panic!("a call that panics")))
            .unwrap_or_else(|_| panic!("spawn"));
        let deadline = Instant::now() + Duration::from_secs(10);
        while pool.threads() > 0 {
            assert!(Instant::now() < deadline, "the thread was not counted out");
            std::thread::yield_now();
        }
        let (tx, rx) = mpsc::channel();
        pool.run(Box::new(move || tx.send(()).unwrap()))
            .unwrap_or_else(|_| panic!("spawn"));
        rx.recv_timeout(Duration::from_secs(10)).unwrap();
    }

    /// A TLS server for one exchange on 127.0.0.1 (certificate for
    /// `localhost`): the port and the certificate to trust (PEM).
    fn one_tls_exchange() -> (u16, String) {
        use std::io::{Read, Write};
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let pem = cert.pem();
        let key = rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], key)
        .unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let conn = rustls::ServerConnection::new(Arc::new(config)).unwrap();
            let mut tls = rustls::StreamOwned::new(conn, stream);
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && tls.read(&mut byte).unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            let _ = tls.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}");
            let _ = tls.flush();
        });
        (port, pem)
    }

    #[tokio::test]
    async fn a_tls_exchange_fits_a_caller_threads_stack() {
        // A stack overflow aborts the test binary: the failure is loud. The
        // call runs as the hub runs it: a target's own TLS connector on one of
        // the target's caller threads.
        let (port, pem) = one_tls_exchange();
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, pem).unwrap();
        let mut cfg =
            crate::config::TargetConfig::with_url("core", &format!("https://localhost:{port}"));
        cfg.ca_file = Some(ca);
        let budget = Duration::from_secs(20);
        let target = crate::core_client::Target::new(&cfg, budget).unwrap();
        let request = crate::core_client::CoreRequest::Inquiry { guid: "G1".into() };
        let end = target
            .attempt(&request, 0, tokio::time::Instant::now() + budget)
            .await;
        match end {
            crate::core_client::CallEnd::Done(Ok(a)) => assert_eq!(a.status, 200),
            crate::core_client::CallEnd::Done(Err(e)) => panic!("{e:?}"),
            crate::core_client::CallEnd::Pending(_) => panic!("pending"),
        }
    }

    #[test]
    fn a_dropped_pool_lets_its_idle_threads_end() {
        let pool = Callers::new("test-caller");
        let (tx, rx) = mpsc::channel();
        pool.run(Box::new(move || tx.send(()).unwrap()))
            .unwrap_or_else(|_| panic!("spawn"));
        rx.recv().unwrap();
        let shared = pool.shared.clone();
        let deadline = Instant::now() + Duration::from_secs(10);
        while lock(&shared.idle).is_empty() {
            assert!(Instant::now() < deadline, "the thread never went idle");
            std::thread::yield_now();
        }
        drop(pool);
        while shared.threads.load(Ordering::Relaxed) > 0 {
            assert!(Instant::now() < deadline, "the idle thread did not end");
            std::thread::yield_now();
        }
    }
}
