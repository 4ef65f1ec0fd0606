//! Length-prefixed framing (docs/protocol.md section 2): a 4-byte prefix, then exactly
//! that many telegram bytes.
//!
//! Pure and socket-free: [`FrameCodec::decode`] looks at whatever is buffered and
//! either takes one whole telegram out, says "need more" (`Ok(None)`, the buffer left
//! as it was), or reports why the stream can no longer be trusted. The server reads
//! into a `BytesMut`, calls `decode` until it gets `Ok(None)`, and reads again; the
//! same code is property-tested with every possible split of a stream.

use std::fmt;

use bytes::{Buf, Bytes, BytesMut};

/// Width of the length prefix in both modes.
pub const PREFIX_LEN: usize = 4;

/// Default maximum telegram length (section 2).
pub const DEFAULT_MAX_LEN: usize = 4096;

/// The largest length a 4-digit ASCII prefix can carry.
pub const ASCII_PREFIX_MAX: usize = 9999;

/// How the 4-byte length prefix is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PrefixMode {
    /// Four ASCII digits, zero-padded (`0132`): the default, readable in a hex dump.
    #[default]
    Ascii,
    /// A big-endian `u32`.
    Binary,
}

impl PrefixMode {
    /// Its name in the config and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            PrefixMode::Ascii => "ascii",
            PrefixMode::Binary => "binary",
        }
    }
}

/// Frames telegrams with a length prefix; cheap to copy, holds no buffer of its own.
#[derive(Debug, Clone, Copy)]
pub struct FrameCodec {
    /// Prefix encoding.
    pub mode: PrefixMode,
    /// Largest telegram accepted by [`FrameCodec::decode`].
    pub max_len: usize,
}

/// Why a stream cannot be read any further. Every variant means the connection
/// must be answered E102 with a blank header and closed: after a bad prefix the
/// hub no longer knows where the next telegram starts.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    /// Ascii mode: a prefix byte that is not an ASCII digit. Reported as soon as the
    /// bad byte is buffered, without waiting for all four.
    #[error("length prefix byte {offset} is {}, not an ASCII digit", ByteDisplay(*.byte))]
    BadPrefix {
        /// Position of the bad byte within the prefix (0..4).
        offset: usize,
        /// The byte itself.
        byte: u8,
    },
    /// The prefix says 0: a telegram cannot be empty.
    #[error("length prefix at byte 0 is 0: a telegram cannot be empty")]
    ZeroLength,
    /// The prefix says more than the configured maximum (decode), or a telegram is
    /// too long for the prefix to carry (encode).
    #[error("length prefix at byte 0: telegram length {len} exceeds the maximum of {max} bytes")]
    TooLong {
        /// The length asked for.
        len: usize,
        /// The limit it broke.
        max: usize,
    },
}

/// Whether a prefix that cannot be read in `mode` reads as the other mode's:
/// four ASCII digits read as a binary length (`0064` is 808465972), or a
/// binary length of 1 to 9999 that is not ASCII digits. Says what the bytes
/// are, and which prefix they are.
pub fn other_prefix(mode: PrefixMode, buffered: &[u8]) -> Option<(String, PrefixMode)> {
    let prefix: [u8; PREFIX_LEN] = buffered.get(..PREFIX_LEN)?.try_into().ok()?;
    let as_binary = u32::from_be_bytes(prefix);
    let digits = prefix.iter().all(u8::is_ascii_digit);
    match mode {
        PrefixMode::Binary if digits => Some((
            format!(
                "{as_binary} is ASCII '{}'",
                String::from_utf8_lossy(&prefix)
            ),
            PrefixMode::Ascii,
        )),
        PrefixMode::Ascii if !digits && (1..=9999).contains(&as_binary) => Some((
            format!(
                "bytes {:02x} {:02x} {:02x} {:02x} are not ASCII digits, but read as a binary length they are {as_binary}",
                prefix[0], prefix[1], prefix[2], prefix[3]
            ),
            PrefixMode::Binary,
        )),
        _ => None,
    }
}

/// Whether bytes that cannot be framed begin a TLS record (content type
/// 0x16 handshake or 0x15 alert, then version 3.x): a peer that speaks TLS
/// where plain telegrams were expected. Says which record it is.
pub fn tls_record(buffered: &[u8]) -> Option<&'static str> {
    match buffered {
        [0x16, 0x03, ..] => Some("a TLS handshake"),
        [0x15, 0x03, ..] => Some("a TLS alert"),
        _ => None,
    }
}

impl Default for FrameCodec {
    /// Ascii prefix, 4096-byte maximum: the protocol's defaults.
    fn default() -> Self {
        Self::new(PrefixMode::Ascii, DEFAULT_MAX_LEN)
    }
}

impl FrameCodec {
    /// A codec for `mode` that accepts telegrams up to `max_len` bytes.
    pub fn new(mode: PrefixMode, max_len: usize) -> Self {
        Self { mode, max_len }
    }

    /// Takes one telegram out of `buf`.
    ///
    /// `Ok(Some(telegram))` consumes prefix and telegram from `buf`; `Ok(None)` means
    /// more bytes are needed and `buf` is untouched; `Err` means the stream cannot be
    /// resynchronised. A bad, zero or too-long prefix is reported as soon as it is
    /// buffered, before its telegram arrives, so the hub never waits for bytes it
    /// will refuse anyway.
    pub fn decode(&self, buf: &mut BytesMut) -> Result<Option<Bytes>, FrameError> {
        let Some(total) = self.complete_len(buf)? else {
            return Ok(None);
        };
        buf.advance(PREFIX_LEN);
        Ok(Some(buf.split_to(total - PREFIX_LEN).freeze()))
    }

    /// The size (prefix included) of the whole frame at the front of `buf`,
    /// when it is all there; the same errors as [`FrameCodec::decode`], which
    /// would take that frame. Consumes nothing.
    pub fn complete_len(&self, buf: &[u8]) -> Result<Option<usize>, FrameError> {
        let Some(len) = self.peek_len(buf)? else {
            return Ok(None);
        };
        if len == 0 {
            return Err(FrameError::ZeroLength);
        }
        if len > self.max_len {
            return Err(FrameError::TooLong {
                len,
                max: self.max_len,
            });
        }
        Ok((buf.len() - PREFIX_LEN >= len).then_some(PREFIX_LEN + len))
    }

    /// Reads the length from a complete prefix; `Ok(None)` when it is not all there.
    fn peek_len(&self, buf: &[u8]) -> Result<Option<usize>, FrameError> {
        match self.mode {
            PrefixMode::Ascii => {
                let mut len = 0usize;
                for (offset, &byte) in buf.iter().take(PREFIX_LEN).enumerate() {
                    if !byte.is_ascii_digit() {
                        return Err(FrameError::BadPrefix { offset, byte });
                    }
                    len = len * 10 + usize::from(byte - b'0');
                }
                Ok((buf.len() >= PREFIX_LEN).then_some(len))
            }
            PrefixMode::Binary => Ok(buf.first_chunk::<PREFIX_LEN>().map(|prefix| {
                // u32 always fits in usize on the 32/64-bit targets the hub runs on.
                usize::try_from(u32::from_be_bytes(*prefix)).unwrap_or(usize::MAX)
            })),
        }
    }

    /// Appends prefix and telegram to `dst`.
    ///
    /// Only the prefix's capacity is checked (ascii: 9999, binary: `u32::MAX`), not
    /// `max_len`: that limit protects the hub from what it reads, and a response the
    /// hub built itself is never refused for it. An empty telegram is
    /// [`FrameError::ZeroLength`], since no peer would accept it.
    pub fn encode(&self, telegram: &[u8], dst: &mut BytesMut) -> Result<(), FrameError> {
        let len = telegram.len();
        if len == 0 {
            return Err(FrameError::ZeroLength);
        }
        let max = self.prefix_capacity();
        if len > max {
            return Err(FrameError::TooLong { len, max });
        }
        dst.reserve(PREFIX_LEN + len);
        match self.mode {
            PrefixMode::Ascii => {
                let mut prefix = [b'0'; PREFIX_LEN];
                let mut rest = len;
                for digit in prefix.iter_mut().rev() {
                    // `rest % 10` is a single digit, so the cast cannot truncate.
                    *digit = b'0' + (rest % 10) as u8;
                    rest /= 10;
                }
                dst.extend_from_slice(&prefix);
            }
            PrefixMode::Binary => {
                let len = u32::try_from(len).map_err(|_| FrameError::TooLong { len, max })?;
                dst.extend_from_slice(&len.to_be_bytes());
            }
        }
        dst.extend_from_slice(telegram);
        Ok(())
    }

    /// The longest telegram the prefix itself can describe.
    pub fn prefix_capacity(&self) -> usize {
        match self.mode {
            PrefixMode::Ascii => ASCII_PREFIX_MAX,
            PrefixMode::Binary => usize::try_from(u32::MAX).unwrap_or(usize::MAX),
        }
    }
}

/// Shows a byte the way an operator reads a hex dump: `0x47 ('G')`, or just `0x0A`
/// when it is not printable.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ByteDisplay(pub(crate) u8);

impl fmt::Display for ByteDisplay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        if b.is_ascii_graphic() || b == b' ' {
            write!(f, "0x{b:02X} ('{}')", char::from(b))
        } else {
            write!(f, "0x{b:02X}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_other_prefix_is_recognised() {
        let (what, other) = other_prefix(PrefixMode::Binary, b"0132TRF001").unwrap();
        assert_eq!(other, PrefixMode::Ascii);
        assert!(what.contains("808530738 is ASCII '0132'"), "{what}");
        let (what, other) = other_prefix(PrefixMode::Ascii, &[0, 0, 0, 0x84, b'T']).unwrap();
        assert_eq!(other, PrefixMode::Binary);
        assert!(what.contains("they are 132"), "{what}");
        assert_eq!(other_prefix(PrefixMode::Ascii, b"ABCD"), None);
        assert_eq!(other_prefix(PrefixMode::Binary, &[0, 0, 0, 0x40]), None);
        assert_eq!(other_prefix(PrefixMode::Binary, b"01"), None);
    }

    fn ascii() -> FrameCodec {
        FrameCodec::default()
    }

    fn binary() -> FrameCodec {
        FrameCodec::new(PrefixMode::Binary, DEFAULT_MAX_LEN)
    }

    #[test]
    fn default_is_ascii_4096() {
        let c = FrameCodec::default();
        assert_eq!(c.mode, PrefixMode::Ascii);
        assert_eq!(c.max_len, 4096);
        assert_eq!(PrefixMode::default(), PrefixMode::Ascii);
    }

    #[test]
    fn prefix_mode_serde_is_lowercase() {
        assert_eq!(
            serde_json::to_string(&PrefixMode::Binary).unwrap(),
            "\"binary\""
        );
        let m: PrefixMode = serde_json::from_str("\"ascii\"").unwrap();
        assert_eq!(m, PrefixMode::Ascii);
        assert!(serde_json::from_str::<PrefixMode>("\"Ascii\"").is_err());
    }

    #[test]
    fn ascii_decodes_one_telegram_and_leaves_the_rest() {
        let mut buf = BytesMut::from(&b"0003abc0002x"[..]);
        let t = ascii().decode(&mut buf).unwrap().unwrap();
        assert_eq!(&t[..], b"abc");
        assert_eq!(&buf[..], b"0002x");
        assert_eq!(ascii().decode(&mut buf), Ok(None));
        assert_eq!(&buf[..], b"0002x", "need-more leaves the buffer untouched");
        buf.extend_from_slice(b"y");
        assert_eq!(&ascii().decode(&mut buf).unwrap().unwrap()[..], b"xy");
        assert!(buf.is_empty());
        assert_eq!(ascii().decode(&mut buf), Ok(None));
    }

    #[test]
    fn binary_decodes_big_endian() {
        let mut buf = BytesMut::from(&[0u8, 0, 1, 2][..]);
        assert_eq!(binary().decode(&mut buf), Ok(None));
        buf.extend_from_slice(&[7u8; 258]);
        let t = binary().decode(&mut buf).unwrap().unwrap();
        assert_eq!(t.len(), 258);
        assert!(buf.is_empty());
    }

    #[test]
    fn complete_len_agrees_with_decode_at_every_cut() {
        let codec = ascii();
        let mut whole = BytesMut::new();
        codec.encode(b"ABCDEFG", &mut whole).unwrap();
        codec.encode(b"HIJ", &mut whole).unwrap();
        for cut in 0..=whole.len() {
            let part = &whole[..cut];
            let len = codec.complete_len(part).unwrap();
            let mut buf = BytesMut::from(part);
            let decoded = codec.decode(&mut buf).unwrap();
            assert_eq!(len.is_some(), decoded.is_some(), "cut {cut}");
            if let (Some(len), Some(t)) = (len, decoded) {
                assert_eq!(len, 4 + t.len(), "cut {cut}");
                assert_eq!(buf.len(), cut - len, "cut {cut}");
            }
        }
        assert!(codec.complete_len(b"00x1").is_err());
        assert!(codec.complete_len(b"0000").is_err());
    }

    #[test]
    fn partial_prefix_is_need_more() {
        for partial in [&b""[..], b"0", b"01", b"013"] {
            let mut buf = BytesMut::from(partial);
            assert_eq!(ascii().decode(&mut buf), Ok(None));
            assert_eq!(&buf[..], partial);
        }
        let mut buf = BytesMut::from(&[0u8, 0, 0][..]);
        assert_eq!(binary().decode(&mut buf), Ok(None));
    }

    #[test]
    fn bad_ascii_prefix_is_reported_at_once() {
        let mut buf = BytesMut::from(&b"01G"[..]);
        let err = ascii().decode(&mut buf).unwrap_err();
        assert_eq!(
            err,
            FrameError::BadPrefix {
                offset: 2,
                byte: b'G'
            }
        );
        assert_eq!(
            err.to_string(),
            "length prefix byte 2 is 0x47 ('G'), not an ASCII digit"
        );
        let mut buf = BytesMut::from(&b"\x00"[..]);
        let err = ascii().decode(&mut buf).unwrap_err();
        assert_eq!(err, FrameError::BadPrefix { offset: 0, byte: 0 });
        assert_eq!(
            err.to_string(),
            "length prefix byte 0 is 0x00, not an ASCII digit"
        );
        // A space is not a digit either: `  12` is not a valid prefix.
        let mut buf = BytesMut::from(&b" 012"[..]);
        assert_eq!(
            ascii().decode(&mut buf),
            Err(FrameError::BadPrefix {
                offset: 0,
                byte: b' '
            })
        );
    }

    #[test]
    fn zero_length_is_an_error() {
        let mut buf = BytesMut::from(&b"0000"[..]);
        assert_eq!(ascii().decode(&mut buf), Err(FrameError::ZeroLength));
        let mut buf = BytesMut::from(&[0u8; 4][..]);
        assert_eq!(binary().decode(&mut buf), Err(FrameError::ZeroLength));
        assert_eq!(
            FrameError::ZeroLength.to_string(),
            "length prefix at byte 0 is 0: a telegram cannot be empty"
        );
    }

    #[test]
    fn too_long_is_reported_before_the_body_arrives() {
        let mut buf = BytesMut::from(&b"4097"[..]);
        let err = ascii().decode(&mut buf).unwrap_err();
        assert_eq!(
            err,
            FrameError::TooLong {
                len: 4097,
                max: 4096
            }
        );
        assert_eq!(
            err.to_string(),
            "length prefix at byte 0: telegram length 4097 exceeds the maximum of 4096 bytes"
        );
        let mut buf = BytesMut::from(&[0xFFu8; 4][..]);
        assert_eq!(
            binary().decode(&mut buf),
            Err(FrameError::TooLong {
                len: 0xFFFF_FFFF,
                max: 4096
            })
        );
        // Exactly the maximum is fine.
        let mut buf = BytesMut::from(&b"4096"[..]);
        buf.extend_from_slice(&[b'x'; 4096]);
        assert_eq!(ascii().decode(&mut buf).unwrap().unwrap().len(), 4096);
    }

    #[test]
    fn small_max_len_is_honoured() {
        let c = FrameCodec::new(PrefixMode::Ascii, 64);
        let mut buf = BytesMut::from(&b"0065"[..]);
        assert_eq!(
            c.decode(&mut buf),
            Err(FrameError::TooLong { len: 65, max: 64 })
        );
    }

    #[test]
    fn encode_ascii_and_binary() {
        let mut dst = BytesMut::new();
        ascii().encode(b"hello", &mut dst).unwrap();
        assert_eq!(&dst[..], b"0005hello");
        let mut dst = BytesMut::new();
        binary().encode(b"hi", &mut dst).unwrap();
        assert_eq!(&dst[..], b"\x00\x00\x00\x02hi");
    }

    #[test]
    fn encode_appends() {
        let mut dst = BytesMut::from(&b"0001a"[..]);
        ascii().encode(b"bc", &mut dst).unwrap();
        assert_eq!(&dst[..], b"0001a0002bc");
    }

    #[test]
    fn encode_checks_prefix_capacity_not_max_len() {
        let small = FrameCodec::new(PrefixMode::Ascii, 10);
        let mut dst = BytesMut::new();
        small.encode(&[b'x'; 64], &mut dst).unwrap();
        assert_eq!(&dst[..4], b"0064");

        let big = vec![b'x'; 10_000];
        let mut dst = BytesMut::new();
        assert_eq!(
            ascii().encode(&big, &mut dst),
            Err(FrameError::TooLong {
                len: 10_000,
                max: 9999
            })
        );
        assert!(dst.is_empty(), "nothing written on error");
        ascii().encode(&big[..9999], &mut dst).unwrap();
        assert_eq!(&dst[..4], b"9999");
        let mut dst = BytesMut::new();
        binary().encode(&big, &mut dst).unwrap();
        assert_eq!(&dst[..4], &10_000u32.to_be_bytes());
    }

    #[test]
    fn encode_refuses_empty() {
        let mut dst = BytesMut::new();
        assert_eq!(ascii().encode(b"", &mut dst), Err(FrameError::ZeroLength));
        assert!(dst.is_empty());
    }

    #[test]
    fn byte_display() {
        assert_eq!(ByteDisplay(b'A').to_string(), "0x41 ('A')");
        assert_eq!(ByteDisplay(b' ').to_string(), "0x20 (' ')");
        assert_eq!(ByteDisplay(0x7F).to_string(), "0x7F");
        assert_eq!(ByteDisplay(0xBF).to_string(), "0xBF");
    }
}
