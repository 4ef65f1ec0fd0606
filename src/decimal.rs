//! Decimal digits written by hand: numbers in a layout's fields and on every
//! log line, where the formatting machinery costs a few hundred instructions
//! per number.

/// `value` in decimal, as `{value}` writes it, in the end of `buf`.
pub fn digits(mut value: u64, buf: &mut [u8; 20]) -> &str {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    // ASCII digits only.
    std::str::from_utf8(&buf[at..]).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    proptest::proptest! {
        /// A number is written as `{}` writes it.
        #[test]
        fn a_number_is_written_as_display_writes_it(value: u64) {
            let mut buf = [0; 20];
            proptest::prop_assert_eq!(super::digits(value, &mut buf), value.to_string());
        }
    }
}
