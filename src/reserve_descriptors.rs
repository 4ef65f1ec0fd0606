//! File descriptors held in reserve, so that a hub at its open-file limit can
//! still take a connection off a listener: the telegram listener to turn a
//! channel away at once, the admin listener to answer a scrape or a probe.
//!
//! At the limit, `accept` fails (`EMFILE`) and the connection stays in the
//! listen backlog. A channel there has connected, may have sent a telegram,
//! and hears nothing until a descriptor frees up, perhaps after its own
//! timeout, and then the telegram it gave up on would still be read and
//! handled; an operator's `/metrics` waits the same way, just when it is
//! needed. With descriptors kept for the purpose, a listener closes one,
//! accepts the waiting connection in its place, and opens the reserve again
//! once that connection is done: the telegram listener closes it at once (as
//! it does past `max_connections`: nothing read, so nothing sent), the admin
//! listener serves it.
//!
//! At the limit `accept` fails even with nothing waiting (the kernel takes a
//! descriptor first): then there is nothing to do but wait for the next
//! connection.

use std::fs::File;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};

/// `EMFILE` (the process's limit) and `ENFILE` (the system's), the same
/// numbers on Linux and the BSDs.
const OUT_OF_DESCRIPTORS: [i32; 2] = [24, 23];

/// Whether `e` says the process or the system ran out of file descriptors.
pub fn is_out_of_descriptors(e: &io::Error) -> bool {
    e.raw_os_error()
        .is_some_and(|n| OUT_OF_DESCRIPTORS.contains(&n))
}

/// Up to `size` descriptors in reserve (`/dev/null` opened for reading).
pub struct Reserve {
    files: Arc<Mutex<Vec<File>>>,
    size: usize,
}

/// What [`Reserve::accept`] did.
#[derive(Debug)]
pub enum FromReserve {
    /// A waiting connection, accepted in a reserved descriptor's place. Drop
    /// the stream before the [`Held`]: the reserve is reopened then, in the
    /// descriptor the stream frees.
    Accepted(TcpStream, SocketAddr, Held),
    /// None was waiting. The listener's readiness is spent, so the next
    /// accept waits for the next connection.
    NoneWaiting,
    /// No descriptor in reserve (none could be opened again since), or the
    /// accept failed again (another thread took the freed descriptor first):
    /// the connection stays in the backlog.
    Failed,
}

/// A reserved descriptor lent to a connection: given back (opened again)
/// when dropped.
#[derive(Debug)]
pub struct Held(Arc<Mutex<Vec<File>>>);

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(file) = reserve() {
            lock(&self.0).push(file);
        }
    }
}

impl Reserve {
    pub fn new(size: usize) -> Reserve {
        let r = Reserve {
            files: Arc::default(),
            size,
        };
        r.top_up();
        r
    }

    /// Descriptors in reserve now.
    pub fn available(&self) -> usize {
        lock(&self.files).len()
    }

    /// With one reserved descriptor closed for the moment, takes the
    /// connection waiting on `listener`, if one is there now.
    pub async fn accept(&self, listener: &TcpListener) -> FromReserve {
        // Those that could not be opened again (another thread took the
        // descriptor first) are tried again first.
        self.top_up();
        let Some(file) = lock(&self.files).pop() else {
            return FromReserve::Failed;
        };
        drop(file);
        let accepted = tokio::select! {
            biased;
            accepted = listener.accept() => Some(accepted),
            () = std::future::ready(()) => None,
        };
        // Lent to the connection, or given back at once (opened again as
        // it drops) when there is none.
        let held = Held(self.files.clone());
        match accepted {
            Some(Ok((stream, peer))) => FromReserve::Accepted(stream, peer, held),
            Some(Err(_)) => FromReserve::Failed,
            None => FromReserve::NoneWaiting,
        }
    }

    /// Opens what is missing of the reserve, as far as the limit allows.
    /// Counted with the descriptors lent out: those come back on their own.
    /// A descriptor freed for an accept can be taken by another thread
    /// first, and then it cannot be opened again at once: callers top up
    /// whenever a descriptor may have come free (a connection accepted or
    /// closed), so a reserve that lost one gets it back.
    pub fn top_up(&self) {
        let lent = Arc::strong_count(&self.files) - 1;
        let mut files = lock(&self.files);
        while files.len() + lent < self.size {
            match reserve() {
                Some(f) => files.push(f),
                None => break,
            }
        }
    }
}

fn lock(files: &Mutex<Vec<File>>) -> std::sync::MutexGuard<'_, Vec<File>> {
    // A Vec of files cannot be left half-changed by a panic.
    files.lock().unwrap_or_else(|p| p.into_inner())
}

fn reserve() -> Option<File> {
    File::open("/dev/null").ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_descriptors_is_emfile_or_enfile_only() {
        assert!(is_out_of_descriptors(&io::Error::from_raw_os_error(24)));
        assert!(is_out_of_descriptors(&io::Error::from_raw_os_error(23)));
        assert!(!is_out_of_descriptors(&io::Error::from_raw_os_error(103)));
        assert!(!is_out_of_descriptors(&io::Error::other("no code")));
    }

    /// A waiting connection is accepted in a reserved descriptor's place,
    /// which comes back once the connection is dropped; with none waiting,
    /// nothing is taken and the reserve is whole.
    #[tokio::test]
    async fn a_waiting_connection_takes_a_reserved_descriptor_until_dropped() {
        use std::io::Read;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let reserve = Reserve::new(2);
        assert_eq!(reserve.available(), 2);
        assert!(matches!(
            reserve.accept(&listener).await,
            FromReserve::NoneWaiting
        ));
        assert_eq!(reserve.available(), 2);

        let mut channel = std::net::TcpStream::connect(addr).unwrap();
        // Taken once the runtime has seen the listener readable (a bounded
        // wait on that, not a sleep).
        let (stream, held) = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            loop {
                if let FromReserve::Accepted(stream, _, held) = reserve.accept(&listener).await {
                    return (stream, held);
                }
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the waiting connection is accepted");
        assert_eq!(reserve.available(), 1, "one lent to the connection");
        drop(stream);
        drop(held);
        assert_eq!(reserve.available(), 2, "given back");

        channel
            .set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let mut byte = [0u8; 1];
        match channel.read(&mut byte) {
            Ok(0) => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {}
            other => panic!("the closed connection's channel read {other:?}"),
        }
    }
}
