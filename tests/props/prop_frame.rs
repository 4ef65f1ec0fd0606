//! Property tests for the length-prefix framing: however the stream is split, the
//! same telegrams come out; whatever bytes arrive, `decode` answers sensibly.

use bytes::BytesMut;
use proptest::prelude::*;
use relayhub::frame::{FrameCodec, FrameError, PrefixMode};

fn mode() -> impl Strategy<Value = PrefixMode> {
    prop_oneof![Just(PrefixMode::Ascii), Just(PrefixMode::Binary)]
}

fn telegrams() -> impl Strategy<Value = Vec<Vec<u8>>> {
    prop::collection::vec(prop::collection::vec(any::<u8>(), 1..300), 1..8)
}

/// Feeds `stream` in chunks of the given sizes (cycled), decoding after each chunk.
fn decode_in_chunks(
    codec: &FrameCodec,
    stream: &[u8],
    sizes: &[usize],
) -> (Vec<Vec<u8>>, BytesMut) {
    let mut out = Vec::new();
    let mut buf = BytesMut::new();
    let mut rest = stream;
    let mut sizes = sizes.iter().cycle();
    while !rest.is_empty() {
        let n = (*sizes.next().unwrap()).min(rest.len());
        buf.extend_from_slice(&rest[..n]);
        rest = &rest[n..];
        while let Some(t) = codec.decode(&mut buf).expect("a valid stream never errors") {
            out.push(t.to_vec());
        }
    }
    (out, buf)
}

proptest! {
    #[test]
    fn any_split_yields_the_same_telegrams(
        mode in mode(),
        telegrams in telegrams(),
        sizes in prop::collection::vec(1usize..64, 1..16),
    ) {
        let codec = FrameCodec::new(mode, 4096);
        let mut stream = BytesMut::new();
        for t in &telegrams {
            codec.encode(t, &mut stream).unwrap();
        }
        let (got, left) = decode_in_chunks(&codec, &stream, &sizes);
        prop_assert_eq!(got, telegrams.clone());
        prop_assert!(left.is_empty());
        // One byte at a time, the extreme split.
        let (got, _) = decode_in_chunks(&codec, &stream, &[1]);
        prop_assert_eq!(got, telegrams);
    }

    #[test]
    fn encode_then_decode_roundtrips(mode in mode(), t in prop::collection::vec(any::<u8>(), 1..5000)) {
        let codec = FrameCodec::new(mode, 9999);
        let mut buf = BytesMut::new();
        codec.encode(&t, &mut buf).unwrap();
        prop_assert_eq!(buf.len(), t.len() + 4);
        let got = codec.decode(&mut buf).unwrap().unwrap();
        prop_assert_eq!(&got[..], &t[..]);
        prop_assert!(buf.is_empty());
    }

    /// Arbitrary bytes never panic, and each answer is exactly what the prefix says.
    #[test]
    fn arbitrary_bytes_get_a_precise_answer(
        mode in mode(),
        max_len in 1usize..5000,
        bytes in prop::collection::vec(
            prop_oneof![any::<u8>(), b'0'..=b'9', Just(0u8)], 0..200),
    ) {
        let codec = FrameCodec::new(mode, max_len);
        let mut buf = BytesMut::from(&bytes[..]);
        loop {
            let before = buf.clone();
            // The length the prefix announces, computed independently.
            let prefix = &before[..before.len().min(4)];
            match codec.decode(&mut buf) {
                Ok(Some(t)) => {
                    prop_assert!(!t.is_empty() && t.len() <= max_len);
                    prop_assert_eq!(&t[..], &before[4..4 + t.len()]);
                    prop_assert_eq!(&buf[..], &before[4 + t.len()..]);
                }
                Ok(None) => {
                    prop_assert_eq!(&buf, &before, "need-more leaves the buffer untouched");
                    match mode {
                        PrefixMode::Ascii => prop_assert!(prefix.iter().all(u8::is_ascii_digit)),
                        PrefixMode::Binary => {}
                    }
                    if before.len() >= 4 {
                        let len = announced(mode, prefix);
                        prop_assert!(len >= 1 && len <= max_len && before.len() < 4 + len);
                    }
                    break;
                }
                Err(FrameError::BadPrefix { offset, byte }) => {
                    prop_assert_eq!(mode, PrefixMode::Ascii);
                    prop_assert!(offset < 4);
                    prop_assert_eq!(before[offset], byte);
                    prop_assert!(!byte.is_ascii_digit());
                    prop_assert!(before[..offset].iter().all(u8::is_ascii_digit));
                    break;
                }
                Err(FrameError::ZeroLength) => {
                    prop_assert_eq!(announced(mode, prefix), 0);
                    break;
                }
                Err(FrameError::TooLong { len, max }) => {
                    prop_assert_eq!(max, max_len);
                    prop_assert_eq!(len, announced(mode, prefix));
                    prop_assert!(len > max_len);
                    break;
                }
            }
        }
    }
}

fn announced(mode: PrefixMode, prefix: &[u8]) -> usize {
    match mode {
        PrefixMode::Ascii => std::str::from_utf8(prefix).unwrap().parse().unwrap(),
        PrefixMode::Binary => u32::from_be_bytes(prefix.try_into().unwrap()) as usize,
    }
}
