//! One file descriptor held in reserve, so that a hub at its open-file limit
//! still turns a channel away at once instead of leaving it unanswered.
//!
//! At the limit, `accept` fails (`EMFILE`) and the connection stays in the
//! listen backlog: its channel has connected, may have sent a telegram, and
//! hears nothing until a descriptor frees up, perhaps after its own timeout,
//! and then the telegram it gave up on would still be read and handled. With
//! a descriptor kept for the purpose, the hub closes it, accepts the waiting
//! connection, closes that at once (as it does past `max_connections`:
//! nothing read, so nothing sent), and opens the spare again. At the limit
//! `accept` fails even with nothing waiting (the kernel takes a descriptor
//! first): then there is nothing to do but wait for the next connection.

use std::fs::File;
use std::io;

use tokio::net::TcpListener;

/// `EMFILE` (the process's limit) and `ENFILE` (the system's), the same
/// numbers on Linux and the BSDs.
const OUT_OF_DESCRIPTORS: [i32; 2] = [24, 23];

/// Whether `e` says the process or the system ran out of file descriptors.
pub fn is_out_of_descriptors(e: &io::Error) -> bool {
    e.raw_os_error()
        .is_some_and(|n| OUT_OF_DESCRIPTORS.contains(&n))
}

/// The descriptor in reserve; `None` while it could not be opened (it is
/// tried again on the next use).
pub struct SpareDescriptor(Option<File>);

/// What [`SpareDescriptor::turn_away`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnAway {
    /// A waiting connection was accepted and closed.
    Closed,
    /// None was waiting: at the limit, `accept` fails before it looks at the
    /// backlog. The listener's readiness is spent, so the next accept waits
    /// for the next connection.
    NoneWaiting,
    /// No reserve to give (it could not be reopened last time), or the accept
    /// failed again (another thread took the freed descriptor first): the
    /// connection stays in the backlog.
    Failed,
}

impl SpareDescriptor {
    pub fn open() -> SpareDescriptor {
        SpareDescriptor(reserve())
    }

    /// With the spare closed for the moment, takes the connection waiting on
    /// `listener`, if one is there now, and closes it; then opens the spare
    /// again.
    pub async fn turn_away(&mut self, listener: &TcpListener) -> TurnAway {
        if self.0.take().is_none() {
            self.0 = reserve();
            return TurnAway::Failed;
        }
        let turned = tokio::select! {
            biased;
            accepted = listener.accept() => match accepted {
                Ok(_) => TurnAway::Closed,
                Err(_) => TurnAway::Failed,
            },
            () = std::future::ready(()) => TurnAway::NoneWaiting,
        };
        self.0 = reserve();
        turned
    }
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

    /// A waiting connection is accepted and closed: its channel reads the
    /// end of the stream (or a reset) at once. With none waiting, nothing is
    /// taken and the spare is back.
    #[tokio::test]
    async fn a_waiting_connection_is_closed_and_the_spare_reopened() {
        use std::io::Read;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut spare = SpareDescriptor::open();
        assert_eq!(spare.turn_away(&listener).await, TurnAway::NoneWaiting);
        assert!(spare.0.is_some());

        let mut channel = std::net::TcpStream::connect(addr).unwrap();
        // Taken once the runtime has seen the listener readable (a bounded
        // wait on that, not a sleep).
        tokio::time::timeout(std::time::Duration::from_secs(10), async {
            while spare.turn_away(&listener).await != TurnAway::Closed {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the waiting connection is turned away");
        assert!(spare.0.is_some(), "the spare is open again");
        channel
            .set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let mut byte = [0u8; 1];
        match channel.read(&mut byte) {
            Ok(0) => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {}
            other => panic!("the turned-away channel read {other:?}"),
        }
    }
}
