//! What a socket holds right now, without waiting and without taking it.
//!
//! On Linux one `recv` with `MSG_PEEK | MSG_DONTWAIT`; elsewhere the socket
//! is switched to non-blocking around a peek and back (three system calls).

use std::io;
use std::net::TcpStream;

/// What a look at a socket found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Peeked {
    /// Nothing to read yet: a read would wait.
    Nothing,
    /// At least one byte (left in the socket).
    Bytes,
    /// The end of the stream, or an error.
    Closed,
}

/// Looks at `stream` without blocking. On Linux the socket stays as it was;
/// elsewhere it is left blocking (every caller's socket is).
pub(crate) fn peek_now(stream: &TcpStream) -> Peeked {
    #[cfg(target_os = "linux")]
    return peek_fd_now(stream);
    #[cfg(not(target_os = "linux"))]
    peeked(peek_toggling(stream))
}

/// [`peek_now`] on any socket's descriptor, such as a tokio stream's (Linux
/// only: elsewhere the answer is always [`Peeked::Nothing`]).
pub(crate) fn peek_fd_now(fd: &impl std::os::fd::AsRawFd) -> Peeked {
    #[cfg(target_os = "linux")]
    return peeked(recv_peek(fd.as_raw_fd()));
    #[cfg(not(target_os = "linux"))]
    {
        let _ = fd;
        Peeked::Nothing
    }
}

fn peeked(result: io::Result<usize>) -> Peeked {
    match result {
        Ok(0) => Peeked::Closed,
        Ok(_) => Peeked::Bytes,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Peeked::Nothing,
        Err(_) => Peeked::Closed,
    }
}

#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn recv_peek(fd: std::os::fd::RawFd) -> io::Result<usize> {
    let mut byte = 0u8;
    loop {
        // SAFETY: one byte into a live local, from a descriptor the caller
        // holds open for the call.
        let n = unsafe {
            libc::recv(
                fd,
                (&raw mut byte).cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn peek_toggling(stream: &TcpStream) -> io::Result<usize> {
    stream.set_nonblocking(true)?;
    let peeked = stream.peek(&mut [0u8; 1]);
    stream.set_nonblocking(false)?;
    peeked
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::TcpListener;

    #[test]
    fn nothing_then_bytes_left_in_place_then_closed() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let near = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut far, _) = listener.accept().unwrap();
        assert_eq!(peek_now(&near), Peeked::Nothing);
        far.write_all(b"ab").unwrap();
        // A blocking peek returns once the bytes are here.
        near.peek(&mut [0u8; 1]).unwrap();
        assert_eq!(peek_now(&near), Peeked::Bytes);
        assert_eq!(peek_now(&near), Peeked::Bytes, "the bytes stay");
        let mut two = [0u8; 2];
        std::io::Read::read_exact(&mut &near, &mut two).unwrap();
        assert_eq!(&two, b"ab");
        drop(far);
        assert_eq!(near.peek(&mut [0u8; 1]).unwrap(), 0);
        assert_eq!(peek_now(&near), Peeked::Closed);
        // Still blocking: a read returns the end of the stream, not WouldBlock.
        assert_eq!(std::io::Read::read(&mut &near, &mut two).unwrap(), 0);
    }
}
