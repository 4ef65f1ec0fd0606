//! A channel's side of the wire: build a telegram from JSON by a layout, send it,
//! read the answer and decode it. Used by `relayhub send`, `relayhub bench` and
//! the end-to-end tests.
//!
//! For a channel developer it also says what the hub would refuse before
//! anything is sent ([`check_request`]), why an answer's length prefix cannot be
//! read ([`prefix_hint`]: the hub speaks the other prefix) and what a code means
//! for the operation that got it ([`explain`]).

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::BytesMut;
use serde_json::{Map, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

use crate::config::Operation;
use crate::frame::{FrameCodec, PREFIX_LEN, PrefixMode};
use crate::header::{HEADER_LEN, first_non_guid_byte, parse_header};
use crate::layout::{FieldError, Layout, decode_fields, encode_fields};
use crate::outcome::{Code, CodeTable};

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

/// How a channel speaks TLS to the hub's `tls_listen`: the CA that signed
/// the hub's certificate, the channel's own certificate and key when the hub
/// asks for one, and the name to verify (the host of the address when absent).
#[derive(Debug, Clone)]
pub struct TlsClient {
    pub ca_file: PathBuf,
    pub client_cert: Option<(PathBuf, PathBuf)>,
    pub server_name: Option<String>,
}

impl TlsClient {
    /// Reads the files; the error names the flag and the file.
    pub fn connector(&self) -> Result<TlsConnector, String> {
        use crate::tls_files::{client_builder, key_mismatch, read_certs, read_key, read_roots};
        let text = |e: crate::tls_files::TlsFileError| e.to_string();
        let builder = client_builder()
            .map_err(text)?
            .with_root_certificates(read_roots("--ca", &self.ca_file).map_err(text)?);
        let config = match &self.client_cert {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let certs = read_certs("--client-cert", cert).map_err(text)?;
                let key_der = read_key("--client-key", key).map_err(text)?;
                builder.with_client_auth_cert(certs, key_der).map_err(|e| {
                    text(key_mismatch(
                        ("--client-key", key),
                        ("--client-cert", cert),
                        e,
                    ))
                })?
            }
        };
        Ok(TlsConnector {
            config: Arc::new(config),
            server_name: self.server_name.clone(),
        })
    }
}

/// A TLS client configuration, read once, for any number of connections.
#[derive(Clone)]
pub struct TlsConnector {
    config: Arc<rustls::ClientConfig>,
    server_name: Option<String>,
}

impl std::fmt::Debug for TlsConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConnector")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl TlsConnector {
    /// The name the hub's certificate must bear for `addr` (HOST:PORT).
    fn name_for(&self, addr: &str) -> std::io::Result<rustls::pki_types::ServerName<'static>> {
        let host = match &self.server_name {
            Some(n) => n.as_str(),
            None => addr
                .rsplit_once(':')
                .map(|(h, _)| h)
                .unwrap_or(addr)
                .trim_start_matches('[')
                .trim_end_matches(']'),
        };
        rustls::pki_types::ServerName::try_from(host.to_string()).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{host:?} is not a server name: {e}"),
            )
        })
    }

    /// The rustls configuration (for blocking clients such as `bench`).
    pub fn config(&self) -> Arc<rustls::ClientConfig> {
        self.config.clone()
    }

    /// The server name to verify for `addr`.
    pub fn server_name(
        &self,
        addr: &str,
    ) -> std::io::Result<rustls::pki_types::ServerName<'static>> {
        self.name_for(addr)
    }
}

/// A channel's connection: plain TCP or TLS.
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// One channel connection to a hub.
pub struct Channel {
    stream: Stream,
    codec: FrameCodec,
    buf: BytesMut,
}

impl Channel {
    pub async fn connect(addr: &str, prefix: PrefixMode) -> std::io::Result<Channel> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Channel::over(Stream::Plain(stream), prefix))
    }

    /// Connects to a hub's TLS listener and completes the handshake (the
    /// hub's certificate verified against the connector's CA and name).
    pub async fn connect_tls(
        addr: &str,
        prefix: PrefixMode,
        tls: &TlsConnector,
    ) -> std::io::Result<Channel> {
        let name = tls.name_for(addr)?;
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let stream = tokio_rustls::TlsConnector::from(tls.config.clone())
            .connect(name, stream)
            .await?;
        Ok(Channel::over(Stream::Tls(Box::new(stream)), prefix))
    }

    fn over(stream: Stream, prefix: PrefixMode) -> Channel {
        Channel {
            stream,
            codec: FrameCodec::new(prefix, 9999),
            buf: BytesMut::with_capacity(256),
        }
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
                    // A bad byte is reported at once; the whole prefix says more
                    // (the rest of an answer follows at once, or never).
                    let wait = std::time::Duration::from_millis(500);
                    while self.buf.len() < PREFIX_LEN {
                        let more = tokio::time::timeout(wait, self.stream.read_buf(&mut self.buf));
                        if !matches!(more.await, Ok(Ok(n)) if n > 0) {
                            break;
                        }
                    }
                    let hint = prefix_hint(self.codec.mode, &self.buf)
                        .map(|h| format!("; {h}"))
                        .unwrap_or_default();
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("answer's length prefix: {e}{hint}"),
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
    pub fn stream_mut(&mut self) -> &mut Stream {
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

/// Why an answer's prefix cannot be read in `mode`, when the hub speaks the
/// other prefix: four ASCII digits read as a binary length (`0064` is
/// 808465972), or a binary length that is not ASCII digits.
pub fn prefix_hint(mode: PrefixMode, buffered: &[u8]) -> Option<String> {
    if let Some(record) = crate::frame::tls_record(buffered) {
        return Some(format!(
            "the answer begins {record}: the hub speaks TLS on this port (use --tls)"
        ));
    }
    let (what, other) = crate::frame::other_prefix(mode, buffered)?;
    let other = other.name();
    Some(format!(
        "{what}: the hub speaks the {other} prefix (use --prefix {other})"
    ))
}

/// `[0-9A-Za-z_-]{32}` (header bytes 6-37); the reason names the character
/// and its position.
pub fn check_guid(guid: &str) -> Result<(), String> {
    let n = guid.chars().count();
    if n != 32 {
        return Err(format!(
            "{guid:?} is {n} characters; a GUID is 32 of [0-9A-Za-z_-]"
        ));
    }
    match guid
        .char_indices()
        .find(|&(_, c)| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
    {
        Some((i, c)) => Err(format!(
            "{guid:?}: '{c}' at byte {i} is not one of [0-9A-Za-z_-]"
        )),
        None => Ok(()),
    }
}

/// 1-8 printable ASCII characters, left-aligned (header bytes 38-45), as
/// the hub takes them: a space inside is allowed, the padding is added.
pub fn check_channel_id(id: &str) -> Result<(), String> {
    let n = id.chars().count();
    if n == 0 || n > 8 {
        return Err(format!("{id:?} is {n} characters; a channel id is 1-8"));
    }
    if let Some(c) = id.chars().find(|c| !(' '..='~').contains(c)) {
        return Err(format!("{id:?}: {c:?} is not printable ASCII"));
    }
    if id.starts_with(' ') {
        return Err(format!(
            "{id:?} starts with a space; a channel id is left-aligned"
        ));
    }
    Ok(())
}

/// Builds a request telegram and checks it as the hub would (header, then body
/// by the layout), so a telegram the hub would answer E102 is refused here
/// with the field and its byte offset. Keys the layout does not name are
/// refused too: a misspelt key would otherwise be sent blank. `tx_code` is
/// the header's: a route's own code, which may use another code's layout.
pub fn check_request(
    tx_code: &str,
    layout: &Layout,
    operation: Option<Operation>,
    guid: &str,
    channel_id: &str,
    sent_at: &str,
    fields: &Map<String, Value>,
) -> Result<Vec<u8>, String> {
    check_guid(guid).map_err(|e| format!("guid {e}"))?;
    check_channel_id(channel_id).map_err(|e| format!("channel id {e}"))?;
    if let Some(k) = fields
        .keys()
        .find(|k| !layout.request.iter().any(|f| f.name == **k))
    {
        let names: Vec<&str> = layout.request.iter().map(|f| f.name.as_str()).collect();
        return Err(format!(
            "field `{k}` is not in layout {} (its request fields: {})",
            layout.tx_code,
            names.join(", ")
        ));
    }
    let mut telegram =
        build_telegram(layout, guid, channel_id, sent_at, fields).map_err(|e| e.to_string())?;
    if tx_code.len() != layout.tx_code.len() {
        return Err(format!("tx code {tx_code:?} is not 6 characters"));
    }
    telegram[..tx_code.len()].copy_from_slice(tx_code.as_bytes());
    parse_header(&telegram).map_err(|e| e.to_string())?;
    let body = layout
        .decode_request(&telegram[HEADER_LEN..], HEADER_LEN)
        .map_err(|e| e.to_string())?;
    if operation == Some(Operation::Inquiry) {
        let orig = body.text("orig_guid").unwrap_or("");
        if let Some(at) = first_non_guid_byte(orig) {
            // Placed in the telegram as the hub places it.
            let at = HEADER_LEN + layout.request_offset("orig_guid").unwrap_or(0) + at;
            return Err(format!(
                "field `orig_guid` at byte {at}: {orig:?} is not a GUID of 32 [0-9A-Za-z_-]"
            ));
        }
    }
    Ok(telegram)
}

/// What `code` tells the channel that sent a telegram of `operation` (`None`:
/// a tx code without a route). B-codes are named by their business result from
/// the code table.
pub fn explain(code: &str, operation: Option<Operation>, codes: &CodeTable) -> String {
    let Some(c) = Code::parse(code) else {
        return "unreadable code".into();
    };
    let results = codes.results_for(c).join(" or ");
    let inquiry = operation == Some(Operation::Inquiry);
    match code.as_bytes() {
        b"0000" if inquiry => {
            "the original transfer was processed (its money moved); the body is its result".into()
        }
        [b'B', ..] if inquiry => format!(
            "the original transfer was rejected by the core: {}; no money moved",
            or_unnamed(&results)
        ),
        [b'B', ..] => format!(
            "rejected by the core: {}; no money moved (a resend replays this answer)",
            or_unnamed(&results)
        ),
        b"E901" if inquiry => {
            "the original transfer's outcome is still unknown (the core is processing it or could not be asked); ask again later".into()
        }
        b"E500" if inquiry => {
            "the core says the original transfer ended with a result the hub cannot map; ask the core team".into()
        }
        b"E102" => format!(
            "{}; the hub's log line for this GUID says which field and byte",
            c.meaning()
        ),
        _ => c.meaning().into(),
    }
}

fn or_unnamed(results: &str) -> &str {
    if results.is_empty() {
        "a result the code table does not name"
    } else {
        results
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::builtin;

    #[test]
    fn prefix_hints_name_the_prefix_the_hub_speaks() {
        let h = prefix_hint(PrefixMode::Binary, b"0064TRF001").unwrap();
        assert!(
            h.starts_with("808465972 is ASCII '0064': the hub speaks the ascii prefix"),
            "{h}"
        );
        let h = prefix_hint(PrefixMode::Ascii, &[0, 0, 0, 0x40, b'T']).unwrap();
        assert!(
            h.contains("are 64: the hub speaks the binary prefix"),
            "{h}"
        );
        let h = prefix_hint(PrefixMode::Ascii, &[0x15, 0x03, 0x03, 0x00, 0x02]).unwrap();
        assert!(h.contains("a TLS alert") && h.contains("--tls"), "{h}");
        assert_eq!(prefix_hint(PrefixMode::Ascii, b"0064"), None);
        assert_eq!(prefix_hint(PrefixMode::Ascii, b"ABCD"), None);
        assert_eq!(prefix_hint(PrefixMode::Binary, &[0, 0, 0, 0x40]), None);
        assert_eq!(prefix_hint(PrefixMode::Binary, b"00"), None);
    }

    #[test]
    fn requests_are_checked_as_the_hub_would() {
        let l = builtin();
        let trf = &l["TRF001"];
        let ok: Map<String, Value> = serde_json::from_str(
            r#"{"from_account":"1002003004001","to_bank":"088","to_account":"1002003004002","amount":5}"#,
        )
        .unwrap();
        let g = "20261129IBANK000000000000000001A";
        let t = check_request(
            "TRF001",
            trf,
            Some(Operation::Transfer),
            g,
            "IBANK",
            "20261129132000",
            &ok,
        );
        assert_eq!(t.unwrap().len(), 64 + 68);
        // A route that uses another code's layout sends its own code.
        let alias = check_request(
            "TRF002",
            trf,
            Some(Operation::Transfer),
            g,
            "IBANK",
            "20261129132000",
            &ok,
        )
        .unwrap();
        assert_eq!(&alias[..6], b"TRF002");
        let e = |guid: &str, ch: &str, sent_at: &str, f: &Map<String, Value>| {
            check_request(
                "TRF001",
                trf,
                Some(Operation::Transfer),
                guid,
                ch,
                sent_at,
                f,
            )
            .unwrap_err()
        };
        assert!(e("SHORT", "IBANK", "20261129132000", &ok).contains("5 characters"));
        assert!(e(&format!("{}!", &g[..31]), "IBANK", "20261129132000", &ok).contains("byte 31"));
        assert!(e(g, " IBANK", "20261129132000", &ok).contains("left-aligned"));
        assert!(e(g, "IBANK\u{7f}", "20261129132000", &ok).contains("printable ASCII"));
        // A space inside, as the hub takes it.
        check_request(
            "TRF001",
            &l["TRF001"],
            Some(Operation::Transfer),
            g,
            "I BANK",
            "20261129132000",
            &ok,
        )
        .unwrap();
        assert!(
            e(g, "IBANK", "20261399132000", &ok).contains("header field `sent_at`"),
            "{}",
            e(g, "IBANK", "20261399132000", &ok)
        );
        let mut typo = ok.clone();
        typo.insert("memmo".into(), Value::from("x"));
        assert!(e(g, "IBANK", "20261129132000", &typo).contains("`memmo` is not in layout TRF001"));
        let mut zero = ok.clone();
        zero.insert("amount".into(), Value::from(0));
        assert!(e(g, "IBANK", "20261129132000", &zero).contains("field `amount` at byte 99"));
        let inq: Map<String, Value> =
            serde_json::from_str(r#"{"orig_guid":"20261203XXXXXXXXXXXXXXXXXXXXXX.X"}"#).unwrap();
        let err = check_request(
            "INQ001",
            &l["INQ001"],
            Some(Operation::Inquiry),
            g,
            "IBANK",
            "20261129132000",
            &inq,
        )
        .unwrap_err();
        // Byte 94 of the telegram, where the hub places it too.
        assert!(err.contains("field `orig_guid` at byte 94"), "{err}");
    }

    #[test]
    fn codes_are_explained_by_operation_and_business_result() {
        let t = CodeTable::builtin();
        let (trf, inq) = (Some(Operation::Transfer), Some(Operation::Inquiry));
        assert!(explain("0000", trf, &t).contains("money moved"));
        assert!(explain("0000", inq, &t).starts_with("the original transfer was processed"));
        assert!(explain("B201", trf, &t).contains("INSUFFICIENT_FUNDS"));
        assert!(explain("B202", trf, &t).contains("ACCOUNT_NOT_FOUND"));
        assert!(
            explain("B203", inq, &t)
                .contains("original transfer was rejected by the core: LIMIT_EXCEEDED")
        );
        assert!(explain("B299", trf, &t).contains("does not name"));
        assert!(explain("E102", trf, &t).contains("log line for this GUID"));
        assert_eq!(explain("E902", None, &t), Code::NOT_SENT.meaning());
        assert_eq!(explain("????", None, &t), "unreadable code");
    }
}
