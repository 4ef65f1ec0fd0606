//! Raw-wire helpers: ascii prefixes, answers read off a plain socket,
//! byte-by-byte writes, closes.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::within;

/// Prefixes a telegram with its 4-digit ascii length.
pub fn framed(telegram: &[u8]) -> Vec<u8> {
    let mut v = format!("{:04}", telegram.len()).into_bytes();
    v.extend_from_slice(telegram);
    v
}

/// Reads one ascii-prefixed answer from a raw stream (a socket, or TLS over
/// one): (prefix bytes, telegram).
pub async fn read_raw_answer<S: AsyncRead + Unpin>(s: &mut S) -> (Vec<u8>, Vec<u8>) {
    within(async {
        let mut prefix = [0u8; 4];
        s.read_exact(&mut prefix).await.expect("answer prefix");
        let len: usize = std::str::from_utf8(&prefix)
            .ok()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("answer prefix is not 4 digits: {prefix:?}"));
        let mut t = vec![0u8; len];
        s.read_exact(&mut t).await.expect("answer telegram");
        (prefix.to_vec(), t)
    })
    .await
}

/// Asserts that the hub closes the connection (EOF) with no further bytes.
pub async fn assert_closed(s: &mut TcpStream) {
    let mut rest = Vec::new();
    within(s.read_to_end(&mut rest))
        .await
        .expect("read until close");
    assert!(rest.is_empty(), "bytes after the last answer: {rest:?}");
}

/// Writes `bytes` one at a time, flushing and yielding between them.
pub async fn write_bytewise(s: &mut TcpStream, bytes: &[u8]) {
    for b in bytes {
        s.write_all(std::slice::from_ref(b))
            .await
            .expect("write one byte");
        s.flush().await.unwrap();
        tokio::task::yield_now().await;
    }
}
