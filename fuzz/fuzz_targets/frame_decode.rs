//! `FrameCodec::decode` on arbitrary bytes, in both prefix modes, fed in
//! arbitrary chunks: it never panics or loops, and every call either takes out
//! one whole telegram, asks for more (buffer untouched), or names a specific
//! error that the bytes really contain. Fed whole or in chunks, the stream
//! yields the same telegrams and the same error.
//!
//! Input: byte 0 = mode (bit 0: binary) and chunking seed, bytes 1..3 = max_len
//! (big-endian u16), then the stream.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use relayhub::frame::{FrameCodec, FrameError, PREFIX_LEN, PrefixMode};

/// What a stream decodes to: the telegrams, then either the error that stopped
/// it or the bytes left over waiting for more.
#[derive(Debug, PartialEq, Eq)]
struct Decoded {
    telegrams: Vec<Vec<u8>>,
    end: Result<usize, FrameError>,
}

fn decode_stream(codec: &FrameCodec, stream: &[u8], chunk: impl Fn(usize) -> usize) -> Decoded {
    let mut buf = BytesMut::new();
    let mut telegrams = Vec::new();
    let mut offset = 0; // where the next telegram's prefix starts in `stream`
    let mut fed = 0;
    let mut step = 0;
    loop {
        // Decode everything the buffer holds.
        loop {
            let before = buf.clone();
            match codec.decode(&mut buf) {
                Ok(Some(t)) => {
                    assert!(!t.is_empty(), "an empty telegram came out");
                    assert!(t.len() <= codec.max_len, "a telegram over max_len came out");
                    assert_eq!(
                        buf.len() + PREFIX_LEN + t.len(),
                        before.len(),
                        "consumed prefix + telegram exactly"
                    );
                    assert_eq!(
                        &t[..],
                        &stream[offset + PREFIX_LEN..offset + PREFIX_LEN + t.len()]
                    );
                    offset += PREFIX_LEN + t.len();
                    telegrams.push(t.to_vec());
                }
                Ok(None) => {
                    assert_eq!(buf, before, "need-more leaves the buffer untouched");
                    break;
                }
                Err(e) => {
                    check_error(codec, &before, &e);
                    return Decoded {
                        telegrams,
                        end: Err(e),
                    };
                }
            }
        }
        if fed == stream.len() {
            return Decoded {
                telegrams,
                end: Ok(buf.len()),
            };
        }
        let n = chunk(step).clamp(1, stream.len() - fed);
        buf.extend_from_slice(&stream[fed..fed + n]);
        fed += n;
        step += 1;
    }
}

/// The error is one the buffered bytes really contain.
fn check_error(codec: &FrameCodec, buf: &[u8], e: &FrameError) {
    match *e {
        FrameError::BadPrefix { offset, byte } => {
            assert_eq!(
                codec.mode,
                PrefixMode::Ascii,
                "binary prefixes have no bad bytes"
            );
            assert!(offset < PREFIX_LEN && offset < buf.len());
            assert_eq!(buf[offset], byte);
            assert!(!byte.is_ascii_digit());
            assert!(
                buf[..offset].iter().all(u8::is_ascii_digit),
                "the first bad byte is reported"
            );
        }
        FrameError::ZeroLength => {
            assert!(buf.len() >= PREFIX_LEN);
            assert_eq!(prefix_len(codec, buf), 0);
        }
        FrameError::TooLong { len, max } => {
            assert!(buf.len() >= PREFIX_LEN);
            assert_eq!(max, codec.max_len);
            assert_eq!(prefix_len(codec, buf), len);
            assert!(len > max);
        }
    }
}

fn prefix_len(codec: &FrameCodec, buf: &[u8]) -> usize {
    match codec.mode {
        PrefixMode::Ascii => buf[..PREFIX_LEN]
            .iter()
            .fold(0, |n, b| n * 10 + usize::from(b - b'0')),
        PrefixMode::Binary => u32::from_be_bytes(buf[..PREFIX_LEN].try_into().unwrap()) as usize,
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let mode = if data[0] & 1 == 0 {
        PrefixMode::Ascii
    } else {
        PrefixMode::Binary
    };
    let seed = usize::from(data[0] >> 1);
    let max_len = usize::from(u16::from_be_bytes([data[1], data[2]]));
    let codec = FrameCodec::new(mode, max_len);
    let stream = &data[3..];

    let whole = decode_stream(&codec, stream, |_| usize::MAX);
    let bytewise = decode_stream(&codec, stream, |_| 1);
    // Chunk sizes 1..=128 from a small LCG seeded by the input.
    let chunked = decode_stream(&codec, stream, |step| {
        (seed
            .wrapping_mul(31)
            .wrapping_add(step.wrapping_mul(2_654_435_761))
            >> 3)
            % 128
            + 1
    });
    assert_eq!(whole, bytewise, "whole vs one byte at a time");
    assert_eq!(whole, chunked, "whole vs chunks");

    // Whatever came out encodes back to the same bytes.
    let mut again = BytesMut::new();
    for t in &whole.telegrams {
        codec
            .encode(t, &mut again)
            .expect("a decoded telegram encodes");
    }
    assert_eq!(&again[..], &stream[..again.len()]);
});
