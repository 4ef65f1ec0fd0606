//! Lowercase hex from a table. Fingerprints, trace ids and span ids are
//! written on every telegram; `format!` per byte cost more than the hashing.

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// Writes `bytes` as hex into the start of `out`, which must hold twice as
/// many bytes.
pub fn encode_into(bytes: &[u8], out: &mut [u8]) {
    for (pair, b) in out.chunks_exact_mut(2).zip(bytes) {
        pair[0] = DIGITS[usize::from(b >> 4)];
        pair[1] = DIGITS[usize::from(b & 0xf)];
    }
}

/// Appends `bytes` to `text` as hex: written into a buffer on the stack and
/// appended in one piece (a `push` per digit checks the room each time).
pub fn push(text: &mut String, bytes: &[u8]) {
    text.reserve(2 * bytes.len());
    let mut buf = [0u8; 64];
    for chunk in bytes.chunks(buf.len() / 2) {
        let hex = &mut buf[..2 * chunk.len()];
        encode_into(chunk, hex);
        // Hex digits only: always UTF-8.
        text.push_str(std::str::from_utf8(hex).unwrap_or_default());
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn hex_is_what_format_writes(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
            let want: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            let mut text = String::from("x");
            super::push(&mut text, &bytes);
            prop_assert_eq!(&text[1..], want.as_str());
            let mut out = vec![0u8; 2 * bytes.len()];
            super::encode_into(&bytes, &mut out);
            prop_assert_eq!(String::from_utf8(out).unwrap(), want);
        }
    }
}
