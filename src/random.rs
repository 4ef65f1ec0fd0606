//! Randomness for backoff jitter, fresh GUIDs and hub names: not secrets, so
//! the std hasher's per-process random keys (mixed with the clock) are enough,
//! and no extra crate is needed.

use std::hash::{BuildHasher, Hasher};

/// A random 64-bit number.
pub fn random_u64() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

/// A uniform random number in [0, 1).
pub fn random_unit() -> f64 {
    (random_u64() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_is_in_range_and_varies() {
        let draws: Vec<f64> = (0..100).map(|_| random_unit()).collect();
        assert!(draws.iter().all(|r| (0.0..1.0).contains(r)));
        assert!(draws.windows(2).any(|w| w[0] != w[1]));
    }
}
