//! A channel's side of the wire: build a telegram from JSON by a layout, send it,
//! read the answer and decode it. Used by `relayhub send`, `relayhub bench` and
//! the end-to-end tests.

use bytes::BytesMut;
use serde_json::{Map, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::frame::{FrameCodec, PrefixMode};
use crate::header::HEADER_LEN;
use crate::layout::{FieldError, Layout, decode_fields, encode_fields};

/// Builds a request telegram: header (blank resp_code) + body by the layout.
pub fn build_telegram(
    layout: &Layout,
    guid: &str,
    channel_id: &str,
    sent_at: &str,
    fields: &Map<String, Value>,
) -> Result<Vec<u8>, FieldError> {
    let body = encode_fields(&layout.request, fields, HEADER_LEN)?;
    let mut t = Vec::with_capacity(HEADER_LEN + body.len());
    t.extend_from_slice(layout.tx_code.as_bytes());
    t.extend_from_slice(guid.as_bytes());
    t.extend_from_slice(format!("{channel_id:<8}").as_bytes());
    t.extend_from_slice(sent_at.as_bytes());
    t.extend_from_slice(b"    ");
    t.extend_from_slice(&body);
    Ok(t)
}

/// A decoded answer telegram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub tx_code: String,
    pub guid: String,
    pub channel_id: String,
    pub sent_at: String,
    pub code: String,
    pub body: Vec<u8>,
}

impl Answer {
    /// Splits an answer telegram (without prefix) into its header fields and body.
    pub fn parse(raw: &[u8]) -> Result<Answer, String> {
        if raw.len() < HEADER_LEN {
            return Err(format!(
                "answer is {} bytes, shorter than the 64-byte header",
                raw.len()
            ));
        }
        let s = |a: usize, b: usize| String::from_utf8_lossy(&raw[a..b]).to_string();
        Ok(Answer {
            tx_code: s(0, 6),
            guid: s(6, 38),
            channel_id: s(38, 46).trim_end().to_string(),
            sent_at: s(46, 60),
            code: s(60, 64),
            body: raw[HEADER_LEN..].to_vec(),
        })
    }

    /// The body decoded by the layout's response fields (0000 answers only).
    pub fn fields(&self, layout: &Layout) -> Result<Map<String, Value>, FieldError> {
        decode_fields(&layout.response, &self.body, HEADER_LEN)
    }
}

/// One channel connection to a hub.
pub struct Channel {
    stream: TcpStream,
    codec: FrameCodec,
    buf: BytesMut,
}

impl Channel {
    pub async fn connect(addr: &str, prefix: PrefixMode) -> std::io::Result<Channel> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Channel {
            stream,
            codec: FrameCodec::new(prefix, 9999),
            buf: BytesMut::with_capacity(256),
        })
    }

    /// Sends one telegram.
    pub async fn send(&mut self, telegram: &[u8]) -> std::io::Result<()> {
        let mut framed = BytesMut::with_capacity(telegram.len() + 4);
        self.codec
            .encode(telegram, &mut framed)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
        self.stream.write_all(&framed).await
    }

    /// Reads one answer telegram; `Ok(None)` when the hub closed the connection.
    pub async fn recv(&mut self) -> std::io::Result<Option<Vec<u8>>> {
        loop {
            match self.codec.decode(&mut self.buf) {
                Ok(Some(t)) => return Ok(Some(t.to_vec())),
                Ok(None) => {}
                Err(e) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        e.to_string(),
                    ));
                }
            }
            if self.stream.read_buf(&mut self.buf).await? == 0 {
                return Ok(None);
            }
        }
    }

    /// Sends a telegram and waits for its answer.
    pub async fn exchange(&mut self, telegram: &[u8]) -> std::io::Result<Answer> {
        self.send(telegram).await?;
        let raw = self.recv().await?.ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "hub closed the connection without an answer",
            )
        })?;
        Answer::parse(&raw).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
    }

    /// The raw stream, for tests that write odd bytes.
    pub fn stream_mut(&mut self) -> &mut TcpStream {
        &mut self.stream
    }
}

/// A fresh 32-character GUID: the date, a prefix and a random tail.
pub fn new_guid(prefix: &str) -> String {
    let (a, b) = (crate::random::random_u64(), crate::random::random_u64());
    let date = chrono::Local::now().format("%Y%m%d").to_string();
    let mut g = format!("{date}{prefix}{a:016X}{b:016X}");
    g.retain(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    g.truncate(32);
    while g.len() < 32 {
        g.push('0');
    }
    g
}
